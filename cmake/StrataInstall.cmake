# The installed package: headers, libstrata, the `strata` tool and the CMake
# package, relocatable (docs/install.md). Nothing installed names the build
# machine's LibTorch by path: a consumer finds its LibTorch when it
# configures (cmake/strataConfig.cmake.in), and the tool when it starts
# (cmake/strata-tool.sh.in).

# strata_strip_torch_paths(): call after strata_find_torch() and before the
# targets. Note [LibTorch's path in strata's binaries]: LibTorch's headers
# expand __FILE__ in their inline checks (TORCH_CHECK, TORCH_INTERNAL_ASSERT),
# so every object that includes them would carry the absolute path of the
# build machine's LibTorch in its strings and debug information.
# -ffile-prefix-map writes that prefix as `libtorch/` instead, so messages
# read "libtorch/include/c10/core/TensorImpl.h":1338 on every machine.
function(strata_strip_torch_paths)
  set(prefixes "${TORCH_INSTALL_PREFIX}")
  get_filename_component(real "${TORCH_INSTALL_PREFIX}" REALPATH)
  if(NOT real STREQUAL TORCH_INSTALL_PREFIX)
    list(APPEND prefixes "${real}")
  endif()
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    message(STATUS "strata: ${CMAKE_CXX_COMPILER_ID} has no -ffile-prefix-map; the binaries name ${TORCH_INSTALL_PREFIX}")
    return()
  endif()
  foreach(prefix IN LISTS prefixes)
    add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-ffile-prefix-map=${prefix}/=libtorch/>")
  endforeach()
endfunction()

# strata_install(LIBRARY TOOL): install rules for the library target and
# the tool's executable target.
#
# Note [RUNPATHs of the installed binaries]
# - libstrata.so: $ORIGIN (its own folder); no LibTorch folder. A program
#   that links strata::strata links LibTorch itself (the package's link
#   interface is the consumer's LibTorch), so LibTorch's libraries are
#   already loaded, by the program's own RUNPATH, when libstrata's are
#   looked up.
# - the tool's executable, <libexec>/strata/strata: $ORIGIN/<path to lib>
#   for libstrata; LibTorch comes from the bin/strata script, which finds it
#   at run time (Note [The installed tool finds LibTorch at run time]).
#   A RUNPATH naming LibTorch relative to the prefix would only hold while
#   the prefix and the venv keep their places.
function(strata_install library tool)
  include(GNUInstallDirs)
  include(CMakePackageConfigHelpers)
  set(tool_dir "${CMAKE_INSTALL_LIBEXECDIR}/strata")
  foreach(dir CMAKE_INSTALL_LIBDIR CMAKE_INSTALL_BINDIR CMAKE_INSTALL_LIBEXECDIR CMAKE_INSTALL_INCLUDEDIR)
    if(IS_ABSOLUTE "${${dir}}")
      message(FATAL_ERROR "strata: ${dir}='${${dir}}' is absolute; the install is relocatable only with "
                          "folders relative to the prefix")
    endif()
  endforeach()
  file(RELATIVE_PATH tool_to_lib "/p/${tool_dir}" "/p/${CMAKE_INSTALL_LIBDIR}")
  file(RELATIVE_PATH bin_to_tool "/p/${CMAKE_INSTALL_BINDIR}" "/p/${tool_dir}/strata")
  set_target_properties(${library} PROPERTIES INSTALL_RPATH "$ORIGIN")
  set_target_properties(${tool} PROPERTIES INSTALL_RPATH "$ORIGIN/${tool_to_lib}")

  install(TARGETS ${library} EXPORT strataTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(TARGETS ${tool} RUNTIME DESTINATION ${tool_dir})
  set(STRATA_TOOL_FROM_BIN "${bin_to_tool}")
  configure_file(${PROJECT_SOURCE_DIR}/cmake/strata-tool.sh.in ${PROJECT_BINARY_DIR}/install/strata @ONLY)
  install(PROGRAMS ${PROJECT_BINARY_DIR}/install/strata DESTINATION ${CMAKE_INSTALL_BINDIR})
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/strata DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

  install(EXPORT strataTargets NAMESPACE strata:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/strata)
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/strataConfig.cmake.in
    ${PROJECT_BINARY_DIR}/strataConfig.cmake
    INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/strata)
  write_basic_package_version_file(${PROJECT_BINARY_DIR}/strataConfigVersion.cmake
    COMPATIBILITY SameMinorVersion)
  install(FILES ${PROJECT_BINARY_DIR}/strataConfig.cmake ${PROJECT_BINARY_DIR}/strataConfigVersion.cmake
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/strata)
endfunction()
