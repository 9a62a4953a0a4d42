// strata's declarations of the part of the PJRT C API it calls.
//
// PJRT plugins (XLA's CPU, CUDA and TPU runtimes) export one C symbol,
// `GetPjrtApi`, returning a table of function pointers. Every function takes
// one argument struct whose first two fields are `struct_size` and
// `extension_start`, and returns a `PJRT_Error*` (null on success).
//
// These are not a copy of XLA's `pjrt_c_api.h`: they declare only the
// structs and table slots strata uses, written from the documented ABI at
// version 0.81 (kPjrtApiMajor.kPjrtApiMinor below), in a namespace so they
// never clash with the official header. Table slots strata does not call
// are `void*` placeholders that keep the offsets right.
// tests/xla/pjrt_abi_test.cpp compares every offset and size declared here
// with a packaged copy of the official header when one is installed
// (docs/xla.md, "The PJRT header").
//
// Compatibility rules this relies on (Note [PJRT versions] in plugin.cpp):
// within major 0, a minor bump only appends fields to structs and slots to
// the table, so a struct declared at 0.81 is a prefix of the same struct at
// any later minor, and the plugin reads `struct_size` to see how much of it
// the caller knows.
//
// Private to the PJRT layer (src/xla/, and the tests that check it): the
// public headers in include/strata/xla/ only forward-declare the opaque
// structs they mention, and Plugin::has/call, which need the table's
// layout, are defined in plugin_call.h beside this file.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::xla::capi {

/// The PJRT C API version these declarations were written against.
inline constexpr int kPjrtApiMajor = 0;
inline constexpr int kPjrtApiMinor = 81;

struct PJRT_Extension_Base;
struct PJRT_Error;
struct PJRT_Event;
struct PJRT_Client;
struct PJRT_Device;
struct PJRT_Memory;
struct PJRT_DeviceDescription;
struct PJRT_Executable;
struct PJRT_LoadedExecutable;
struct PJRT_Buffer;
struct PJRT_ExecuteContext;
struct PJRT_SendCallbackInfo;
struct PJRT_RecvCallbackInfo;

/// The size a caller compiled against these declarations reports in
/// `struct_size`: the end of the struct's last declared field (not
/// sizeof, which may include tail padding).
template <class T>
inline constexpr size_t kStructSize = 0;

#define STRATA_PJRT_STRUCT(T, last_field) \
  template <>                             \
  inline constexpr size_t kStructSize<T> = offsetof(T, last_field) + sizeof(T::last_field)

struct PJRT_Api_Version {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  int major_version;
  int minor_version;
};
STRATA_PJRT_STRUCT(PJRT_Api_Version, minor_version);

// ---- errors ------------------------------------------------------------------

/// absl::StatusCode values, as PJRT reports them.
enum PJRT_Error_Code : int {
  PJRT_Error_Code_OK = 0,
  PJRT_Error_Code_CANCELLED = 1,
  PJRT_Error_Code_UNKNOWN = 2,
  PJRT_Error_Code_INVALID_ARGUMENT = 3,
  PJRT_Error_Code_DEADLINE_EXCEEDED = 4,
  PJRT_Error_Code_NOT_FOUND = 5,
  PJRT_Error_Code_ALREADY_EXISTS = 6,
  PJRT_Error_Code_PERMISSION_DENIED = 7,
  PJRT_Error_Code_RESOURCE_EXHAUSTED = 8,
  PJRT_Error_Code_FAILED_PRECONDITION = 9,
  PJRT_Error_Code_ABORTED = 10,
  PJRT_Error_Code_OUT_OF_RANGE = 11,
  PJRT_Error_Code_UNIMPLEMENTED = 12,
  PJRT_Error_Code_INTERNAL = 13,
  PJRT_Error_Code_UNAVAILABLE = 14,
  PJRT_Error_Code_DATA_LOSS = 15,
  PJRT_Error_Code_UNAUTHENTICATED = 16,
};

struct PJRT_Error_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Error* error;
};
STRATA_PJRT_STRUCT(PJRT_Error_Destroy_Args, error);

struct PJRT_Error_Message_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_Error* error;
  const char* message;  // out, owned by the error
  size_t message_size;  // out
};
STRATA_PJRT_STRUCT(PJRT_Error_Message_Args, message_size);

struct PJRT_Error_GetCode_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_Error* error;
  PJRT_Error_Code code;  // out
};
STRATA_PJRT_STRUCT(PJRT_Error_GetCode_Args, code);

// ---- named values (plugin attributes, client options) -----------------------

enum PJRT_NamedValue_Type : int {
  PJRT_NamedValue_kString = 0,
  PJRT_NamedValue_kInt64 = 1,
  PJRT_NamedValue_kInt64List = 2,
  PJRT_NamedValue_kFloat = 3,
  PJRT_NamedValue_kBool = 4,
};

struct PJRT_NamedValue {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const char* name;
  size_t name_size;
  PJRT_NamedValue_Type type;
  union {
    const char* string_value;
    int64_t int64_value;
    const int64_t* int64_array_value;
    float float_value;
    bool bool_value;
  };
  size_t value_size;  // string length, list length, or 1
};
STRATA_PJRT_STRUCT(PJRT_NamedValue, value_size);

// ---- plugin --------------------------------------------------------------------

struct PJRT_Plugin_Initialize_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
};
STRATA_PJRT_STRUCT(PJRT_Plugin_Initialize_Args, extension_start);

struct PJRT_Plugin_Attributes_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_NamedValue* attributes;  // out, owned by the plugin
  size_t num_attributes;              // out
};
STRATA_PJRT_STRUCT(PJRT_Plugin_Attributes_Args, num_attributes);

// ---- events ----------------------------------------------------------------------

/// Destroy, Await and Error share this shape.
struct PJRT_Event_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Event* event;
};
STRATA_PJRT_STRUCT(PJRT_Event_Destroy_Args, event);
using PJRT_Event_Await_Args = PJRT_Event_Destroy_Args;

// ---- client ----------------------------------------------------------------------

/// Makes the PJRT_Error a key-value callback returns (the plugin passes it).
using PJRT_CallbackError = PJRT_Error* (*)(PJRT_Error_Code code, const char* message, size_t message_size);
using PJRT_KeyValueValueDeleter = void (*)(char* value);

/// A multi-process client's store, called by the plugin (Note [Multi-process
/// clients] in client.cpp). Get waits up to timeout_in_ms; TryGet answers
/// NOT_FOUND at once; both hand out a value the plugin frees through
/// value_deleter_callback.
struct PJRT_KeyValueGetCallback_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const char* key;
  size_t key_size;
  int timeout_in_ms;
  PJRT_CallbackError* callback_error;
  void* user_arg;
  char* value;        // out
  size_t value_size;  // out
  PJRT_KeyValueValueDeleter value_deleter_callback;  // out
};
STRATA_PJRT_STRUCT(PJRT_KeyValueGetCallback_Args, value_deleter_callback);

struct PJRT_KeyValueTryGetCallback_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const char* key;
  size_t key_size;
  PJRT_CallbackError* callback_error;
  void* user_arg;
  char* value;        // out
  size_t value_size;  // out
  PJRT_KeyValueValueDeleter value_deleter_callback;  // out
};
STRATA_PJRT_STRUCT(PJRT_KeyValueTryGetCallback_Args, value_deleter_callback);

struct PJRT_KeyValuePutCallback_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const char* key;
  size_t key_size;
  const char* value;  // lives for the call only
  size_t value_size;
  PJRT_CallbackError* callback_error;
  void* user_arg;
};
STRATA_PJRT_STRUCT(PJRT_KeyValuePutCallback_Args, user_arg);

using PJRT_KeyValueGetCallback = PJRT_Error* (*)(PJRT_KeyValueGetCallback_Args* args);
using PJRT_KeyValueTryGetCallback = PJRT_Error* (*)(PJRT_KeyValueTryGetCallback_Args* args);
using PJRT_KeyValuePutCallback = PJRT_Error* (*)(PJRT_KeyValuePutCallback_Args* args);

struct PJRT_Client_Create_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_NamedValue* create_options;
  size_t num_options;
  PJRT_KeyValueGetCallback kv_get_callback;
  void* kv_get_user_arg;
  PJRT_KeyValuePutCallback kv_put_callback;
  void* kv_put_user_arg;
  PJRT_Client* client;  // out
  PJRT_KeyValueTryGetCallback kv_try_get_callback;
  void* kv_try_get_user_arg;
};
STRATA_PJRT_STRUCT(PJRT_Client_Create_Args, kv_try_get_user_arg);

/// Destroy and ProcessIndex-like calls on a client.
struct PJRT_Client_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
};
STRATA_PJRT_STRUCT(PJRT_Client_Destroy_Args, client);

/// PlatformName and PlatformVersion share this shape.
struct PJRT_Client_PlatformName_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const char* value;  // out, owned by the client
  size_t value_size;  // out
};
STRATA_PJRT_STRUCT(PJRT_Client_PlatformName_Args, value_size);
using PJRT_Client_PlatformVersion_Args = PJRT_Client_PlatformName_Args;

struct PJRT_Client_ProcessIndex_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  int process_index;  // out
};
STRATA_PJRT_STRUCT(PJRT_Client_ProcessIndex_Args, process_index);

/// Devices and AddressableDevices share this shape.
struct PJRT_Client_Devices_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  PJRT_Device* const* devices;  // out, owned by the client
  size_t num_devices;           // out
};
STRATA_PJRT_STRUCT(PJRT_Client_Devices_Args, num_devices);
using PJRT_Client_AddressableDevices_Args = PJRT_Client_Devices_Args;

struct PJRT_Program {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  char* code;
  size_t code_size;
  const char* format;  // "mlir" (StableHLO text or bytecode) or "hlo"
  size_t format_size;
};
STRATA_PJRT_STRUCT(PJRT_Program, format_size);

struct PJRT_Client_Compile_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const PJRT_Program* program;
  const char* compile_options;  // a serialized xla.CompileOptionsProto
  size_t compile_options_size;
  PJRT_LoadedExecutable* executable;  // out
};
STRATA_PJRT_STRUCT(PJRT_Client_Compile_Args, executable);

/// Element types, in the ABI's order (xla::PrimitiveType differs).
enum PJRT_Buffer_Type : int {
  PJRT_Buffer_Type_INVALID = 0,
  PJRT_Buffer_Type_PRED = 1,
  PJRT_Buffer_Type_S8 = 2,
  PJRT_Buffer_Type_S16 = 3,
  PJRT_Buffer_Type_S32 = 4,
  PJRT_Buffer_Type_S64 = 5,
  PJRT_Buffer_Type_U8 = 6,
  PJRT_Buffer_Type_U16 = 7,
  PJRT_Buffer_Type_U32 = 8,
  PJRT_Buffer_Type_U64 = 9,
  PJRT_Buffer_Type_F16 = 10,
  PJRT_Buffer_Type_F32 = 11,
  PJRT_Buffer_Type_F64 = 12,
  PJRT_Buffer_Type_BF16 = 13,
  PJRT_Buffer_Type_C64 = 14,
  PJRT_Buffer_Type_C128 = 15,
};

enum PJRT_HostBufferSemantics : int {
  PJRT_HostBufferSemantics_kImmutableOnlyDuringCall = 0,
  PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes = 1,
  PJRT_HostBufferSemantics_kImmutableZeroCopy = 2,
  PJRT_HostBufferSemantics_kMutableZeroCopy = 3,
};

struct PJRT_Client_BufferFromHostBuffer_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const void* data;
  PJRT_Buffer_Type type;
  const int64_t* dims;
  size_t num_dims;
  const int64_t* byte_strides;  // null: dense, row-major
  size_t num_byte_strides;
  PJRT_HostBufferSemantics host_buffer_semantics;
  PJRT_Device* device;
  PJRT_Memory* memory;
  void* device_layout;                // PJRT_Buffer_MemoryLayout* (null: default)
  PJRT_Event* done_with_host_buffer;  // out
  PJRT_Buffer* buffer;                // out
};
STRATA_PJRT_STRUCT(PJRT_Client_BufferFromHostBuffer_Args, buffer);

// ---- devices -----------------------------------------------------------------------

struct PJRT_Device_GetDescription_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Device* device;
  PJRT_DeviceDescription* device_description;  // out
};
STRATA_PJRT_STRUCT(PJRT_Device_GetDescription_Args, device_description);

/// DeviceDescription_Id (and ProcessIndex) share this shape.
struct PJRT_DeviceDescription_Id_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  int id;  // out
};
STRATA_PJRT_STRUCT(PJRT_DeviceDescription_Id_Args, id);
using PJRT_DeviceDescription_ProcessIndex_Args = PJRT_DeviceDescription_Id_Args;

/// DeviceDescription_Kind and _ToString share this shape.
struct PJRT_DeviceDescription_Kind_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  const char* value;  // out, owned by the description
  size_t value_size;  // out
};
STRATA_PJRT_STRUCT(PJRT_DeviceDescription_Kind_Args, value_size);
using PJRT_DeviceDescription_ToString_Args = PJRT_DeviceDescription_Kind_Args;

// ---- executables ---------------------------------------------------------------------

struct PJRT_LoadedExecutable_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable;
};
STRATA_PJRT_STRUCT(PJRT_LoadedExecutable_Destroy_Args, executable);

struct PJRT_LoadedExecutable_GetExecutable_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* loaded_executable;
  PJRT_Executable* executable;  // out, destroyed by the caller
};
STRATA_PJRT_STRUCT(PJRT_LoadedExecutable_GetExecutable_Args, executable);

struct PJRT_Executable_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
};
STRATA_PJRT_STRUCT(PJRT_Executable_Destroy_Args, executable);

struct PJRT_Executable_NumOutputs_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  size_t num_outputs;  // out
};
STRATA_PJRT_STRUCT(PJRT_Executable_NumOutputs_Args, num_outputs);

struct PJRT_ExecuteOptions {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_SendCallbackInfo** send_callbacks;
  PJRT_RecvCallbackInfo** recv_callbacks;
  size_t num_send_ops;
  size_t num_recv_ops;
  int launch_id;
  const int64_t* non_donatable_input_indices;
  size_t num_non_donatable_input_indices;
  PJRT_ExecuteContext* context;
  const char* call_location;
  size_t num_tasks;
  int* task_ids;
  int64_t* incarnation_ids;
};
STRATA_PJRT_STRUCT(PJRT_ExecuteOptions, incarnation_ids);

struct PJRT_LoadedExecutable_Execute_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable;
  PJRT_ExecuteOptions* options;
  PJRT_Buffer* const* const* argument_lists;  // [num_devices][num_args]
  size_t num_devices;
  size_t num_args;
  PJRT_Buffer** const* output_lists;    // [num_devices][num_outputs], filled
  PJRT_Event** device_complete_events;  // [num_devices], optional
  PJRT_Device* execute_device;          // one device of a multi-device program
};
STRATA_PJRT_STRUCT(PJRT_LoadedExecutable_Execute_Args, execute_device);

// ---- buffers ---------------------------------------------------------------------------

/// Destroy has this shape.
struct PJRT_Buffer_Destroy_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
};
STRATA_PJRT_STRUCT(PJRT_Buffer_Destroy_Args, buffer);

struct PJRT_Buffer_ElementType_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  PJRT_Buffer_Type type;  // out
};
STRATA_PJRT_STRUCT(PJRT_Buffer_ElementType_Args, type);

struct PJRT_Buffer_Dimensions_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  const int64_t* dims;  // out, owned by the buffer
  size_t num_dims;      // out
};
STRATA_PJRT_STRUCT(PJRT_Buffer_Dimensions_Args, num_dims);

struct PJRT_Buffer_ToHostBuffer_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* src;
  void* host_layout;  // PJRT_Buffer_MemoryLayout* (null: dense row-major)
  void* dst;          // null: only report the size needed in dst_size
  size_t dst_size;
  PJRT_Event* event;  // out
};
STRATA_PJRT_STRUCT(PJRT_Buffer_ToHostBuffer_Args, event);

// ---- the table --------------------------------------------------------------------------

template <class Args>
using PjrtFn = PJRT_Error* (*)(Args*);

/// GetPjrtApi()'s table, through the last slot strata calls. `void*`
/// slots are functions strata does not call.
struct PJRT_Api {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Api_Version pjrt_api_version;

  void (*PJRT_Error_Destroy)(PJRT_Error_Destroy_Args*);
  void (*PJRT_Error_Message)(PJRT_Error_Message_Args*);
  PjrtFn<PJRT_Error_GetCode_Args> PJRT_Error_GetCode;

  PjrtFn<PJRT_Plugin_Initialize_Args> PJRT_Plugin_Initialize;
  PjrtFn<PJRT_Plugin_Attributes_Args> PJRT_Plugin_Attributes;

  PjrtFn<PJRT_Event_Destroy_Args> PJRT_Event_Destroy;
  void* PJRT_Event_IsReady;
  void* PJRT_Event_Error;
  PjrtFn<PJRT_Event_Await_Args> PJRT_Event_Await;
  void* PJRT_Event_OnReady;

  PjrtFn<PJRT_Client_Create_Args> PJRT_Client_Create;
  PjrtFn<PJRT_Client_Destroy_Args> PJRT_Client_Destroy;
  PjrtFn<PJRT_Client_PlatformName_Args> PJRT_Client_PlatformName;
  PjrtFn<PJRT_Client_ProcessIndex_Args> PJRT_Client_ProcessIndex;
  PjrtFn<PJRT_Client_PlatformVersion_Args> PJRT_Client_PlatformVersion;
  PjrtFn<PJRT_Client_Devices_Args> PJRT_Client_Devices;
  PjrtFn<PJRT_Client_AddressableDevices_Args> PJRT_Client_AddressableDevices;
  void* PJRT_Client_LookupDevice;
  void* PJRT_Client_LookupAddressableDevice;
  void* PJRT_Client_AddressableMemories;
  PjrtFn<PJRT_Client_Compile_Args> PJRT_Client_Compile;
  void* PJRT_Client_DefaultDeviceAssignment;
  PjrtFn<PJRT_Client_BufferFromHostBuffer_Args> PJRT_Client_BufferFromHostBuffer;

  PjrtFn<PJRT_DeviceDescription_Id_Args> PJRT_DeviceDescription_Id;
  PjrtFn<PJRT_DeviceDescription_ProcessIndex_Args> PJRT_DeviceDescription_ProcessIndex;
  void* PJRT_DeviceDescription_Attributes;
  PjrtFn<PJRT_DeviceDescription_Kind_Args> PJRT_DeviceDescription_Kind;
  void* PJRT_DeviceDescription_DebugString;
  PjrtFn<PJRT_DeviceDescription_ToString_Args> PJRT_DeviceDescription_ToString;

  PjrtFn<PJRT_Device_GetDescription_Args> PJRT_Device_GetDescription;
  void* PJRT_Device_IsAddressable;
  void* PJRT_Device_LocalHardwareId;
  void* PJRT_Device_AddressableMemories;
  void* PJRT_Device_DefaultMemory;
  void* PJRT_Device_MemoryStats;

  void* PJRT_Memory_Id;
  void* PJRT_Memory_Kind;
  void* PJRT_Memory_DebugString;
  void* PJRT_Memory_ToString;
  void* PJRT_Memory_AddressableByDevices;

  PjrtFn<PJRT_Executable_Destroy_Args> PJRT_Executable_Destroy;
  void* PJRT_Executable_Name;
  void* PJRT_Executable_NumReplicas;
  void* PJRT_Executable_NumPartitions;
  PjrtFn<PJRT_Executable_NumOutputs_Args> PJRT_Executable_NumOutputs;
  void* PJRT_Executable_SizeOfGeneratedCodeInBytes;
  void* PJRT_Executable_GetCostAnalysis;
  void* PJRT_Executable_OutputMemoryKinds;
  void* PJRT_Executable_OptimizedProgram;
  void* PJRT_Executable_Serialize;

  PjrtFn<PJRT_LoadedExecutable_Destroy_Args> PJRT_LoadedExecutable_Destroy;
  PjrtFn<PJRT_LoadedExecutable_GetExecutable_Args> PJRT_LoadedExecutable_GetExecutable;
  void* PJRT_LoadedExecutable_AddressableDevices;
  void* PJRT_LoadedExecutable_Delete;
  void* PJRT_LoadedExecutable_IsDeleted;
  PjrtFn<PJRT_LoadedExecutable_Execute_Args> PJRT_LoadedExecutable_Execute;
  void* PJRT_Executable_DeserializeAndLoad;
  void* PJRT_LoadedExecutable_Fingerprint;

  PjrtFn<PJRT_Buffer_Destroy_Args> PJRT_Buffer_Destroy;
  PjrtFn<PJRT_Buffer_ElementType_Args> PJRT_Buffer_ElementType;
  PjrtFn<PJRT_Buffer_Dimensions_Args> PJRT_Buffer_Dimensions;
  void* PJRT_Buffer_UnpaddedDimensions;
  void* PJRT_Buffer_DynamicDimensionIndices;
  void* PJRT_Buffer_GetMemoryLayout;
  void* PJRT_Buffer_OnDeviceSizeInBytes;
  void* PJRT_Buffer_Device;
  void* PJRT_Buffer_Memory;
  void* PJRT_Buffer_Delete;
  void* PJRT_Buffer_IsDeleted;
  void* PJRT_Buffer_CopyToDevice;
  PjrtFn<PJRT_Buffer_ToHostBuffer_Args> PJRT_Buffer_ToHostBuffer;
};
STRATA_PJRT_STRUCT(PJRT_Api, PJRT_Buffer_ToHostBuffer);

#undef STRATA_PJRT_STRUCT

/// A value-initialised argument struct with its struct_size set: the only
/// way strata builds one, so that fields appended in a later header stay
/// zero (Note [PJRT versions]).
template <class Args>
Args make_args() {
  static_assert(kStructSize<Args> != 0, "declare the struct with STRATA_PJRT_STRUCT");
  Args args{};
  args.struct_size = kStructSize<Args>;
  return args;
}

}  // namespace strata::xla::capi

/// The plugin's entry point.
extern "C" {
typedef const strata::xla::capi::PJRT_Api* (*StrataGetPjrtApiFn)();
}
