#!/usr/bin/env python3
# Writes the fuzz targets' seed corpus (fuzz/corpus/{safetensors,metadata,sharded}/):
# small checkpoints exactly as strata writes them (safetensors with XXH64
# checksums in __metadata__, metadata.json of the full and sharded layouts and
# of a Trainer checkpoint (a full "trainer" value),
# a world-2 sharded checkpoint packed as fuzz/entry_points.h describes).
# Standard library only. Usage: fuzz/make_corpus.py fuzz/corpus
import json, struct, os, sys
M=(1<<64)-1
P1,P2,P3,P4,P5=0x9E3779B185EBCA87,0xC2B2AE3D27D4EB4F,0x165667B19E3779F9,0x85EBCA77C2B2AE63,0x27D4EB2F165667C5
rl=lambda x,r:((x<<r)|(x>>(64-r)))&M
def rnd(a,i): a=(a+i*P2)&M; a=rl(a,31); return (a*P1)&M
def mrg(a,v): a^=rnd(0,v); return (a*P1+P4)&M
def xxh64(b):
    n=len(b); p=0
    if n>=32:
        v=[(P1+P2)&M,P2,0,(-P1)&M]
        while p+32<=n:
            for i in range(4): v[i]=rnd(v[i],struct.unpack_from('<Q',b,p+8*i)[0])
            p+=32
        h=(rl(v[0],1)+rl(v[1],7)+rl(v[2],12)+rl(v[3],18))&M
        for i in range(4): h=mrg(h,v[i])
    else: h=P5
    h=(h+n)&M
    while p+8<=n: h^=rnd(0,struct.unpack_from('<Q',b,p)[0]); h=(rl(h,27)*P1+P4)&M; p+=8
    if p+4<=n: h^=(struct.unpack_from('<I',b,p)[0]*P1)&M; h=(rl(h,23)*P2+P3)&M; p+=4
    while p<n: h^=(b[p]*P5)&M; h=(rl(h,11)*P1)&M; p+=1
    h^=h>>33; h=(h*P2)&M; h^=h>>29; h=(h*P3)&M; h^=h>>32
    return h
assert xxh64(b"")==0xef46db3751d8e999 and xxh64(b"abc")==0x44bc2cf5ad770999
assert xxh64(b"Nobody inspects the spammish repetition")==0xfbcea83c8a378bf1
def st(tensors, meta=None):
    # tensors: list of (name, dtype, shape, bytes)
    hdr={}
    md=dict(meta or {})
    if tensors: md["strata.xxh64"]="".join("%016x"%xxh64(t[3]) for t in tensors)
    if md: hdr["__metadata__"]=dict(sorted(md.items()))
    off=0
    for name,dt,shape,data in tensors:
        hdr[name]={"dtype":dt,"shape":shape,"data_offsets":[off,off+len(data)]}; off+=len(data)
    text=json.dumps(hdr,separators=(",",":"))
    text+=" "*((8-len(text)%8)%8)
    return struct.pack('<Q',len(text))+text.encode()+b"".join(t[3] for t in tensors)
f32=lambda *v: struct.pack('<%df'%len(v),*v)
out=sys.argv[1]
for d in ("safetensors","metadata","sharded"): os.makedirs(os.path.join(out,d),exist_ok=True)
w=f32(0,1,2,3,4,5); mb=f32(*[1.0]*6); rng=bytes(range(5))
state=[("model/w","F32",[2,3],w),("optimizer/w.momentum_buffer","F32",[2,3],mb),("rng","U8",[5],rng)]
open(os.path.join(out,"safetensors","state.safetensors"),"wb").write(st(state))
open(os.path.join(out,"safetensors","dtypes.safetensors"),"wb").write(st([
  ("w","F32",[3,2],f32(*range(6))),("b","BF16",[2],b"\x80\x3f\x00\x40"),("n","I64",[2],struct.pack('<2q',7,-1)),
  ("s","F64",[],struct.pack('<d',2.5)),("e","F32",[0,3],b""),("one","F16",[1],b"\x00\x3c"),("m","BOOL",[3],b"\x01\x00\x01")],{"note":"seed"}))
open(os.path.join(out,"safetensors","empty.safetensors"),"wb").write(st([]))
sgd={"type":"sgd","param_groups":[{"params":["w"],"options":{"lr":0.1,"momentum":0.9,"dampening":0.0,"weight_decay":0.0,"nesterov":False}}],"state":{"w":{"tensors":["momentum_buffer"]}}}
entries={"model":{"kind":"module"},"optimizer":{"kind":"optimizer","state":sgd},"rng":{"kind":"tensor"},
 "step":{"kind":"value","value":42},"loader":{"kind":"value","value":{"epoch":1,"position":3}}}
full={"entries":entries,"files":["state.safetensors"],"format":"strata-checkpoint","state_dict_type":"full","strategy":"ddp","version":1,"world_size":1}
open(os.path.join(out,"metadata","full.json"),"w").write(json.dumps(full,indent=2)+"\n")
# A Trainer checkpoint's metadata: the same files, with a full "trainer" value
# (src/trainer/trainer_checkpoint.cpp) whose every field the validator checks.
mc="ModelCheckpoint{monitor=val_loss, mode=min, every_n_train_steps=0, every_n_epochs=-1}"
trainer={"format":"strata-trainer","version":1,"epoch":1,"global_step":13,
 "loops":{"fit":{"batches_done":5,"epoch_done":False,"world_size":2,"results":{
  "train_loss":{"on_step":True,"sync_dist":True,"prog_bar":True,"logger":True,"reduce":"mean","total":41.5,"weight":60.0},
  "grad_max":{"on_step":False,"sync_dist":False,"prog_bar":False,"logger":True,"reduce":"max","total":2.25,"weight":5.0}}}},
 "lr_schedulers":[{"type":"StepLR","last_epoch":13,"base_lrs":[0.5,0.25]}],
 "callbacks":{mc:{"monitor":"val_loss","best_model_score":0.5,"best_model_path":"ckpt/best/epoch=0-step=8.ckpt",
   "last_model_path":"ckpt/best/last.ckpt","dirpath":"ckpt/best","last_saved_step":8,
   "best_k_models":{"ckpt/best/epoch=0-step=8.ckpt":0.5,"ckpt/best/epoch=0-step=4.ckpt":0.75,"ckpt/best/epoch=0-step=2.ckpt":None}},
  "EarlyStopping{monitor=val_loss, mode=min}":{"wait_count":1,"best_score":0.5,"stopped_step":-1},
  "Timer":{"time_elapsed":12.5},"LossRecorder":{"anything":[1,2]}},
 "module_extra":{"model_config":{"n_layer":2}},"hparams":{"lr":"0.5","model":"tiny"}}
tr=dict(full); tr["entries"]=dict(entries); tr["entries"]["trainer"]={"kind":"value","value":trainer}
open(os.path.join(out,"metadata","trainer.json"),"w").write(json.dumps(tr,indent=2)+"\n")
rec=lambda s,d,sh:{"shape":s,"dtype":d,"sharded":sh}
sh=dict(full); sh.update({"state_dict_type":"sharded","world_size":2,"resharded_from":1,
  "files":["shard-00000-of-00002.safetensors","shard-00001-of-00002.safetensors"],
  "tensors":{"model/w":rec([2,3],"F32",True),"optimizer/w.momentum_buffer":rec([2,3],"F32",True),"rng":rec([5],"U8",False)}})
r0=st([("model/w","F32",[3],w[:12]),("optimizer/w.momentum_buffer","F32",[3],mb[:12]),("rng","U8",[5],rng)])
r1=st([("model/w","F32",[3],w[12:]),("optimizer/w.momentum_buffer","F32",[3],mb[12:])])
m=json.dumps(sh,indent=2).encode()+b"\n"
open(os.path.join(out,"metadata","sharded.json"),"wb").write(m)
open(os.path.join(out,"safetensors","shard0.safetensors"),"wb").write(r0)
open(os.path.join(out,"sharded","world2.bin"),"wb").write(struct.pack('<I',len(m))+m+struct.pack('<I',len(r0))+r0+r1)
# A one-file checkpoint (metadata in __metadata__["strata"], the model under plain names).
one=dict(full); del one["files"]; one.update({"layout":"file","consolidated_from":1})
one["entries"]=dict(entries); one["entries"]["model"]={"kind":"module","prefix":""}
open(os.path.join(out,"safetensors","onefile.safetensors"),"wb").write(
  st([("w","F32",[2,3],w),("optimizer/w.momentum_buffer","F32",[2,3],mb),("rng","U8",[5],rng)],{"strata":json.dumps(one)}))
# A shard file that describes itself (refused when read on its own).
desc={"rank":1,"world_size":2,"tensors":{"model/w":{"shape":[2,3],"offset":3},"optimizer/w.momentum_buffer":{"shape":[2,3],"offset":3}}}
open(os.path.join(out,"safetensors","shard1-described.safetensors"),"wb").write(
  st([("model/w","F32",[3],w[12:]),("optimizer/w.momentum_buffer","F32",[3],mb[12:])],{"strata.shard":json.dumps(desc)}))
print("ok")
