// strata's declarations of the PJRT C API (src/xla/pjrt_c_api.h, private)
// against a packaged copy of XLA's official pjrt_c_api.h: every field
// offset, struct size, table slot and enum value strata relies on. CMake
// looks for the header in the venv (the xla-cpu-pjrt wheel ships one,
// tensorflow's include/ tree too) or takes -DSTRATA_PJRT_HEADER=PATH; the
// test skips, saying so, when none is found. The header is read at build
// time only; it is not part of strata.
#include <gtest/gtest.h>

#include <cstddef>

#include "pjrt_c_api.h"  // strata's, from src/xla/

#ifdef STRATA_PJRT_PACKAGED_HEADER
#include STRATA_PJRT_PACKAGED_HEADER
#endif

namespace strata::xla {
namespace {

#ifdef STRATA_PJRT_PACKAGED_HEADER

#define SAME_OFFSET(S, mine, theirs) \
  EXPECT_EQ(offsetof(capi::S, mine), offsetof(::S, theirs)) << #S "." #mine " vs " #theirs
#define SAME_FIELD(S, f) SAME_OFFSET(S, f, f)
#define SAME_OFFSET_AS(Mine, Theirs, mine, theirs) \
  EXPECT_EQ(offsetof(capi::Mine, mine), offsetof(::Theirs, theirs)) << #Theirs "." #theirs
// A struct declared at the header's minor has its size; a newer header's
// may only have grown.
#define SAME_SIZE_AS(Mine, Theirs)                                                       \
  do {                                                                                   \
    if (PJRT_API_MINOR == capi::kPjrtApiMinor)                                           \
      EXPECT_EQ(capi::kStructSize<capi::Mine>, size_t(Theirs##_STRUCT_SIZE)) << #Theirs; \
    else                                                                                 \
      EXPECT_LE(capi::kStructSize<capi::Mine>, size_t(Theirs##_STRUCT_SIZE)) << #Theirs; \
  } while (0)
#define SAME_SIZE(S) SAME_SIZE_AS(S, S)

TEST(PjrtAbiTest, VersionIsComparable) {
  ASSERT_EQ(PJRT_API_MAJOR, capi::kPjrtApiMajor) << "the packaged header is of another major version";
  EXPECT_GE(PJRT_API_MINOR, capi::kPjrtApiMinor) << "the packaged header is older than strata's declarations";
  RecordProperty("packaged_header", STRATA_PJRT_PACKAGED_HEADER);
  std::cout << "comparing with " << STRATA_PJRT_PACKAGED_HEADER << " (PJRT C API " << PJRT_API_MAJOR << "."
            << PJRT_API_MINOR << ")\n";
}

TEST(PjrtAbiTest, ArgumentStructsMatch) {
  SAME_FIELD(PJRT_Api_Version, major_version);
  SAME_FIELD(PJRT_Api_Version, minor_version);
  SAME_SIZE(PJRT_Api_Version);

  SAME_FIELD(PJRT_Error_Destroy_Args, error);
  SAME_SIZE(PJRT_Error_Destroy_Args);
  SAME_FIELD(PJRT_Error_Message_Args, error);
  SAME_FIELD(PJRT_Error_Message_Args, message);
  SAME_FIELD(PJRT_Error_Message_Args, message_size);
  SAME_SIZE(PJRT_Error_Message_Args);
  SAME_FIELD(PJRT_Error_GetCode_Args, error);
  SAME_FIELD(PJRT_Error_GetCode_Args, code);
  SAME_SIZE(PJRT_Error_GetCode_Args);

  SAME_FIELD(PJRT_NamedValue, name);
  SAME_FIELD(PJRT_NamedValue, name_size);
  SAME_FIELD(PJRT_NamedValue, type);
  SAME_FIELD(PJRT_NamedValue, string_value);
  SAME_FIELD(PJRT_NamedValue, int64_value);
  SAME_FIELD(PJRT_NamedValue, float_value);
  SAME_FIELD(PJRT_NamedValue, bool_value);
  SAME_FIELD(PJRT_NamedValue, value_size);
  SAME_SIZE(PJRT_NamedValue);

  SAME_SIZE(PJRT_Plugin_Initialize_Args);
  SAME_FIELD(PJRT_Plugin_Attributes_Args, attributes);
  SAME_FIELD(PJRT_Plugin_Attributes_Args, num_attributes);
  SAME_SIZE(PJRT_Plugin_Attributes_Args);

  SAME_FIELD(PJRT_Event_Destroy_Args, event);
  SAME_SIZE(PJRT_Event_Destroy_Args);
  SAME_OFFSET_AS(PJRT_Event_Await_Args, PJRT_Event_Await_Args, event, event);
  SAME_SIZE_AS(PJRT_Event_Await_Args, PJRT_Event_Await_Args);

  SAME_FIELD(PJRT_Client_Create_Args, create_options);
  SAME_FIELD(PJRT_Client_Create_Args, num_options);
  SAME_FIELD(PJRT_Client_Create_Args, kv_get_callback);
  SAME_FIELD(PJRT_Client_Create_Args, kv_put_user_arg);
  SAME_FIELD(PJRT_Client_Create_Args, client);
  SAME_FIELD(PJRT_Client_Create_Args, kv_try_get_callback);
  SAME_FIELD(PJRT_Client_Create_Args, kv_try_get_user_arg);
  SAME_SIZE(PJRT_Client_Create_Args);
  // The multi-process client's store callbacks (Note [Multi-process clients]).
  SAME_FIELD(PJRT_KeyValueGetCallback_Args, key);
  SAME_FIELD(PJRT_KeyValueGetCallback_Args, key_size);
  SAME_FIELD(PJRT_KeyValueGetCallback_Args, timeout_in_ms);
  SAME_FIELD(PJRT_KeyValueGetCallback_Args, callback_error);
  SAME_FIELD(PJRT_KeyValueGetCallback_Args, user_arg);
  SAME_FIELD(PJRT_KeyValueGetCallback_Args, value);
  SAME_FIELD(PJRT_KeyValueGetCallback_Args, value_size);
  SAME_FIELD(PJRT_KeyValueGetCallback_Args, value_deleter_callback);
  SAME_SIZE(PJRT_KeyValueGetCallback_Args);
  SAME_FIELD(PJRT_KeyValueTryGetCallback_Args, key);
  SAME_FIELD(PJRT_KeyValueTryGetCallback_Args, key_size);
  SAME_FIELD(PJRT_KeyValueTryGetCallback_Args, callback_error);
  SAME_FIELD(PJRT_KeyValueTryGetCallback_Args, user_arg);
  SAME_FIELD(PJRT_KeyValueTryGetCallback_Args, value);
  SAME_FIELD(PJRT_KeyValueTryGetCallback_Args, value_size);
  SAME_FIELD(PJRT_KeyValueTryGetCallback_Args, value_deleter_callback);
  SAME_SIZE(PJRT_KeyValueTryGetCallback_Args);
  SAME_FIELD(PJRT_KeyValuePutCallback_Args, key);
  SAME_FIELD(PJRT_KeyValuePutCallback_Args, key_size);
  SAME_FIELD(PJRT_KeyValuePutCallback_Args, value);
  SAME_FIELD(PJRT_KeyValuePutCallback_Args, value_size);
  SAME_FIELD(PJRT_KeyValuePutCallback_Args, callback_error);
  SAME_FIELD(PJRT_KeyValuePutCallback_Args, user_arg);
  SAME_SIZE(PJRT_KeyValuePutCallback_Args);
  SAME_FIELD(PJRT_Client_Destroy_Args, client);
  SAME_SIZE(PJRT_Client_Destroy_Args);
  SAME_OFFSET(PJRT_Client_PlatformName_Args, value, platform_name);
  SAME_OFFSET(PJRT_Client_PlatformName_Args, value_size, platform_name_size);
  SAME_SIZE(PJRT_Client_PlatformName_Args);
  SAME_OFFSET_AS(PJRT_Client_PlatformVersion_Args, PJRT_Client_PlatformVersion_Args, value, platform_version);
  SAME_OFFSET_AS(PJRT_Client_PlatformVersion_Args, PJRT_Client_PlatformVersion_Args, value_size,
                 platform_version_size);
  SAME_SIZE_AS(PJRT_Client_PlatformVersion_Args, PJRT_Client_PlatformVersion_Args);
  SAME_FIELD(PJRT_Client_ProcessIndex_Args, process_index);
  SAME_SIZE(PJRT_Client_ProcessIndex_Args);
  SAME_FIELD(PJRT_Client_Devices_Args, devices);
  SAME_FIELD(PJRT_Client_Devices_Args, num_devices);
  SAME_SIZE(PJRT_Client_Devices_Args);
  SAME_OFFSET_AS(PJRT_Client_AddressableDevices_Args, PJRT_Client_AddressableDevices_Args, devices,
                 addressable_devices);
  SAME_OFFSET_AS(PJRT_Client_AddressableDevices_Args, PJRT_Client_AddressableDevices_Args, num_devices,
                 num_addressable_devices);
  SAME_SIZE_AS(PJRT_Client_AddressableDevices_Args, PJRT_Client_AddressableDevices_Args);

  SAME_FIELD(PJRT_Program, code);
  SAME_FIELD(PJRT_Program, code_size);
  SAME_FIELD(PJRT_Program, format);
  SAME_FIELD(PJRT_Program, format_size);
  SAME_SIZE(PJRT_Program);
  SAME_FIELD(PJRT_Client_Compile_Args, client);
  SAME_FIELD(PJRT_Client_Compile_Args, program);
  SAME_FIELD(PJRT_Client_Compile_Args, compile_options);
  SAME_FIELD(PJRT_Client_Compile_Args, compile_options_size);
  SAME_FIELD(PJRT_Client_Compile_Args, executable);
  SAME_SIZE(PJRT_Client_Compile_Args);

  SAME_FIELD(PJRT_Client_BufferFromHostBuffer_Args, data);
  SAME_FIELD(PJRT_Client_BufferFromHostBuffer_Args, type);
  SAME_FIELD(PJRT_Client_BufferFromHostBuffer_Args, dims);
  SAME_FIELD(PJRT_Client_BufferFromHostBuffer_Args, num_dims);
  SAME_FIELD(PJRT_Client_BufferFromHostBuffer_Args, byte_strides);
  SAME_FIELD(PJRT_Client_BufferFromHostBuffer_Args, host_buffer_semantics);
  SAME_FIELD(PJRT_Client_BufferFromHostBuffer_Args, device);
  SAME_FIELD(PJRT_Client_BufferFromHostBuffer_Args, memory);
  SAME_FIELD(PJRT_Client_BufferFromHostBuffer_Args, device_layout);
  SAME_FIELD(PJRT_Client_BufferFromHostBuffer_Args, done_with_host_buffer);
  SAME_FIELD(PJRT_Client_BufferFromHostBuffer_Args, buffer);
  SAME_SIZE(PJRT_Client_BufferFromHostBuffer_Args);

  SAME_FIELD(PJRT_Device_GetDescription_Args, device);
  SAME_FIELD(PJRT_Device_GetDescription_Args, device_description);
  SAME_SIZE(PJRT_Device_GetDescription_Args);
  SAME_FIELD(PJRT_DeviceDescription_Id_Args, id);
  SAME_SIZE(PJRT_DeviceDescription_Id_Args);
  SAME_OFFSET_AS(PJRT_DeviceDescription_ProcessIndex_Args, PJRT_DeviceDescription_ProcessIndex_Args, id,
                 process_index);
  SAME_SIZE_AS(PJRT_DeviceDescription_ProcessIndex_Args, PJRT_DeviceDescription_ProcessIndex_Args);
  SAME_OFFSET(PJRT_DeviceDescription_Kind_Args, value, device_kind);
  SAME_OFFSET(PJRT_DeviceDescription_Kind_Args, value_size, device_kind_size);
  SAME_SIZE(PJRT_DeviceDescription_Kind_Args);
  SAME_OFFSET_AS(PJRT_DeviceDescription_ToString_Args, PJRT_DeviceDescription_ToString_Args, value,
                 to_string);
  SAME_OFFSET_AS(PJRT_DeviceDescription_ToString_Args, PJRT_DeviceDescription_ToString_Args, value_size,
                 to_string_size);
  SAME_SIZE_AS(PJRT_DeviceDescription_ToString_Args, PJRT_DeviceDescription_ToString_Args);

  SAME_FIELD(PJRT_LoadedExecutable_Destroy_Args, executable);
  SAME_SIZE(PJRT_LoadedExecutable_Destroy_Args);
  SAME_FIELD(PJRT_LoadedExecutable_GetExecutable_Args, loaded_executable);
  SAME_FIELD(PJRT_LoadedExecutable_GetExecutable_Args, executable);
  SAME_SIZE(PJRT_LoadedExecutable_GetExecutable_Args);
  SAME_FIELD(PJRT_Executable_Destroy_Args, executable);
  SAME_SIZE(PJRT_Executable_Destroy_Args);
  SAME_FIELD(PJRT_Executable_NumOutputs_Args, num_outputs);
  SAME_SIZE(PJRT_Executable_NumOutputs_Args);

  SAME_FIELD(PJRT_ExecuteOptions, launch_id);
  SAME_FIELD(PJRT_ExecuteOptions, non_donatable_input_indices);
  SAME_FIELD(PJRT_ExecuteOptions, context);
  SAME_FIELD(PJRT_ExecuteOptions, incarnation_ids);
  SAME_SIZE(PJRT_ExecuteOptions);
  SAME_FIELD(PJRT_LoadedExecutable_Execute_Args, executable);
  SAME_FIELD(PJRT_LoadedExecutable_Execute_Args, options);
  SAME_FIELD(PJRT_LoadedExecutable_Execute_Args, argument_lists);
  SAME_FIELD(PJRT_LoadedExecutable_Execute_Args, num_devices);
  SAME_FIELD(PJRT_LoadedExecutable_Execute_Args, num_args);
  SAME_FIELD(PJRT_LoadedExecutable_Execute_Args, output_lists);
  SAME_FIELD(PJRT_LoadedExecutable_Execute_Args, device_complete_events);
  SAME_FIELD(PJRT_LoadedExecutable_Execute_Args, execute_device);
  SAME_SIZE(PJRT_LoadedExecutable_Execute_Args);

  SAME_FIELD(PJRT_Buffer_Destroy_Args, buffer);
  SAME_SIZE(PJRT_Buffer_Destroy_Args);
  SAME_FIELD(PJRT_Buffer_ElementType_Args, type);
  SAME_SIZE(PJRT_Buffer_ElementType_Args);
  SAME_FIELD(PJRT_Buffer_Dimensions_Args, dims);
  SAME_FIELD(PJRT_Buffer_Dimensions_Args, num_dims);
  SAME_SIZE(PJRT_Buffer_Dimensions_Args);
  SAME_FIELD(PJRT_Buffer_ToHostBuffer_Args, src);
  SAME_FIELD(PJRT_Buffer_ToHostBuffer_Args, host_layout);
  SAME_FIELD(PJRT_Buffer_ToHostBuffer_Args, dst);
  SAME_FIELD(PJRT_Buffer_ToHostBuffer_Args, dst_size);
  SAME_FIELD(PJRT_Buffer_ToHostBuffer_Args, event);
  SAME_SIZE(PJRT_Buffer_ToHostBuffer_Args);
}

TEST(PjrtAbiTest, FunctionTableSlotsMatch) {
#define SLOT(name) EXPECT_EQ(offsetof(capi::PJRT_Api, name), offsetof(::PJRT_Api, name)) << #name
  SLOT(pjrt_api_version);
  SLOT(PJRT_Error_Destroy);
  SLOT(PJRT_Error_Message);
  SLOT(PJRT_Error_GetCode);
  SLOT(PJRT_Plugin_Initialize);
  SLOT(PJRT_Plugin_Attributes);
  SLOT(PJRT_Event_Destroy);
  SLOT(PJRT_Event_Await);
  SLOT(PJRT_Client_Create);
  SLOT(PJRT_Client_Destroy);
  SLOT(PJRT_Client_PlatformName);
  SLOT(PJRT_Client_ProcessIndex);
  SLOT(PJRT_Client_PlatformVersion);
  SLOT(PJRT_Client_Devices);
  SLOT(PJRT_Client_AddressableDevices);
  SLOT(PJRT_Client_Compile);
  SLOT(PJRT_Client_BufferFromHostBuffer);
  SLOT(PJRT_DeviceDescription_Id);
  SLOT(PJRT_DeviceDescription_ProcessIndex);
  SLOT(PJRT_DeviceDescription_Kind);
  SLOT(PJRT_DeviceDescription_ToString);
  SLOT(PJRT_Device_GetDescription);
  SLOT(PJRT_Executable_Destroy);
  SLOT(PJRT_Executable_NumOutputs);
  SLOT(PJRT_LoadedExecutable_Destroy);
  SLOT(PJRT_LoadedExecutable_GetExecutable);
  SLOT(PJRT_LoadedExecutable_Execute);
  SLOT(PJRT_Buffer_Destroy);
  SLOT(PJRT_Buffer_ElementType);
  SLOT(PJRT_Buffer_Dimensions);
  SLOT(PJRT_Buffer_ToHostBuffer);
#undef SLOT
}

TEST(PjrtAbiTest, EnumValuesMatch) {
#define SAME_VALUE(name) EXPECT_EQ(static_cast<int>(capi::name), static_cast<int>(::name)) << #name
  SAME_VALUE(PJRT_Error_Code_INVALID_ARGUMENT);
  SAME_VALUE(PJRT_Error_Code_UNAUTHENTICATED);
  SAME_VALUE(PJRT_NamedValue_kString);
  SAME_VALUE(PJRT_NamedValue_kInt64);
  SAME_VALUE(PJRT_NamedValue_kInt64List);
  SAME_VALUE(PJRT_NamedValue_kFloat);
  SAME_VALUE(PJRT_NamedValue_kBool);
  SAME_VALUE(PJRT_Buffer_Type_PRED);
  SAME_VALUE(PJRT_Buffer_Type_S8);
  SAME_VALUE(PJRT_Buffer_Type_S64);
  SAME_VALUE(PJRT_Buffer_Type_U8);
  SAME_VALUE(PJRT_Buffer_Type_U64);
  SAME_VALUE(PJRT_Buffer_Type_F16);
  SAME_VALUE(PJRT_Buffer_Type_F32);
  SAME_VALUE(PJRT_Buffer_Type_F64);
  SAME_VALUE(PJRT_Buffer_Type_BF16);
  SAME_VALUE(PJRT_Buffer_Type_C128);
  SAME_VALUE(PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes);
  SAME_VALUE(PJRT_HostBufferSemantics_kMutableZeroCopy);
#undef SAME_VALUE
  EXPECT_EQ(sizeof(capi::PJRT_Buffer_Type), sizeof(::PJRT_Buffer_Type));
  EXPECT_EQ(sizeof(capi::PJRT_Error_Code), sizeof(::PJRT_Error_Code));
  EXPECT_EQ(sizeof(capi::PJRT_NamedValue_Type), sizeof(::PJRT_NamedValue_Type));
}

#else

TEST(PjrtAbiTest, SkippedWithoutAPackagedHeader) {
  GTEST_SKIP()
      << "no packaged pjrt_c_api.h was found at configure time (pip install the xla-cpu-pjrt pinned in "
         "scripts/requirements.txt, or configure with -DSTRATA_PJRT_HEADER=PATH); strata's declarations "
         "are not compared";
}

#endif

}  // namespace
}  // namespace strata::xla
