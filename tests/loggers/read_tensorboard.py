#!/usr/bin/python3
"""Reads a TensorBoard run folder with the `tensorboard` package's own readers.

Prints one JSON object to stdout:
  {"files": [event file names],
   "records": {file name: number of records, every CRC checked},
   "first_events": {file name: {"file_version": ..., "step": ...}},
   "scalars": {tag: [[step, value], ...]},     (EventAccumulator)
   "hparams": the hparams.yaml mapping or null,
   "hparams_plugin": {name: value} from the last session_start_info the
                     hparams plugin finds, or null,
   "hparams_experiment": {"hparams": {name: DataType name},
                          "metrics": [metric tags]} from its experiment, or null,
   "hparams_session_end": the session_end_info's Status name, or null,
   "hparams_tab": what the HPARAMS tab lists: the session groups that
                  TensorBoard's hparams plugin backend returns for its
                  /session_groups route, each {"hparams": {name: value},
                  "metrics": {tag: value}}}
Values that JSON cannot hold are the strings "nan", "inf", "-inf".

Usage: read_tensorboard.py RUN_DIR
Exit status 77 when the tensorboard package is not installed, 1 with a
message on stderr when a file does not read.
"""
import json
import math
import os
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator, event_file_loader
    from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow
except ImportError as e:
    print("the tensorboard package is not installed (%s); pip install -r scripts/requirements.txt" % e,
          file=sys.stderr)
    sys.exit(77)


def jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def count_records(path):
    """Reads every record with TensorBoard's TFRecord reader (checks both CRCs)."""
    reader = pywrap_tensorflow.PyRecordReader_New(path.encode())
    count = 0
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return count
        count += 1


def hparams_tab(run_dir):
    """The session groups of TensorBoard's HPARAMS tab, from the plugin's own handler."""
    from google.protobuf import json_format
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import api_pb2, backend_context, list_session_groups
    mux = plugin_event_multiplexer.EventMultiplexer()
    mux.AddRunsFromDirectory(run_dir)
    mux.Reload()
    tb = base_plugin.TBContext(logdir=run_dir, multiplexer=mux,
                               data_provider=data_provider.MultiplexerDataProvider(mux, run_dir))
    request = api_pb2.ListSessionGroupsRequest(
        start_index=0, slice_size=100,
        allowed_statuses=[api_pb2.STATUS_UNKNOWN, api_pb2.STATUS_SUCCESS, api_pb2.STATUS_FAILURE,
                          api_pb2.STATUS_RUNNING])
    response = list_session_groups.Handler(context.RequestContext(), backend_context.Context(tb), "", request).run()
    return [{"hparams": {k: jsonable(json_format.MessageToDict(v)) for k, v in g.hparams.items()},
             "metrics": {m.name.tag: jsonable(m.value) for m in g.metric_values}}
            for g in response.session_groups]


def main():
    run_dir = sys.argv[1]
    files = sorted(f for f in os.listdir(run_dir) if "tfevents" in f)
    out = {"files": files, "records": {}, "first_events": {}, "scalars": {}, "hparams": None}
    for name in files:
        path = os.path.join(run_dir, name)
        out["records"][name] = count_records(path)
        first = next(iter(event_file_loader.EventFileLoader(path).Load()), None)
        if first is not None:
            out["first_events"][name] = {"file_version": first.file_version, "step": first.step,
                                         "what": first.WhichOneof("what")}
    acc = event_accumulator.EventAccumulator(run_dir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    for tag in acc.Tags()["scalars"]:
        out["scalars"][tag] = [[e.step, jsonable(e.value)] for e in acc.Scalars(tag)]
    out["hparams_plugin"] = None
    out["hparams_experiment"] = None
    out["hparams_session_end"] = None
    try:
        content = acc.PluginTagToContent("hparams")
    except KeyError:  # no summary of the hparams plugin in the run
        content = {}
    if "_hparams_/session_start_info" in content:
        from tensorboard.plugins.hparams import plugin_data_pb2
        data = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
        out["hparams_plugin"] = {k: jsonable(getattr(v, v.WhichOneof("kind")))
                                 for k, v in data.session_start_info.hparams.items()}
    if "_hparams_/experiment" in content:
        from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2
        exp = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
        out["hparams_experiment"] = {
            "hparams": {h.name: api_pb2.DataType.Name(h.type) for h in exp.hparam_infos},
            "metrics": [m.name.tag for m in exp.metric_infos]}
    if "_hparams_/session_end_info" in content:
        from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2
        end = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_end_info"]).session_end_info
        out["hparams_session_end"] = api_pb2.Status.Name(end.status)
    out["hparams_tab"] = hparams_tab(run_dir)
    hparams = os.path.join(run_dir, "hparams.yaml")
    if os.path.exists(hparams):
        import yaml
        with open(hparams) as f:
            out["hparams"] = {str(k): jsonable(v) if not isinstance(v, str) else v
                              for k, v in (yaml.safe_load(f) or {}).items()}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
