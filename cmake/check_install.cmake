# Install into a scratch prefix, then build and run the README's example
# against it the way another C program would: through pkg-config, and
# through the CMake package.
set(prefix ${BIN}/install-check)
file(REMOVE_RECURSE ${prefix})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BIN} --prefix ${prefix}
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed")
endif()
file(GLOB pcfile ${prefix}/lib*/pkgconfig/kvserde.pc)
if(NOT pcfile)
  message(FATAL_ERROR "no kvserde.pc installed under ${prefix}")
endif()
get_filename_component(pcdir ${pcfile} DIRECTORY)
set(ENV{PKG_CONFIG_PATH} ${pcdir})
execute_process(COMMAND pkg-config --cflags --libs kvserde
                OUTPUT_VARIABLE flags RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config cannot resolve kvserde")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
execute_process(COMMAND ${CC} -std=c11 -Wall -Werror ${EXTRA_CFLAGS} ${EXAMPLE}
                        -o ${prefix}/example ${flags}
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the example does not build against the installed library")
endif()
get_filename_component(libdir ${pcdir} DIRECTORY)
set(ENV{LD_LIBRARY_PATH} ${libdir})
execute_process(COMMAND ${prefix}/example OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT out MATCHES "32 bf16 bytes -> 16 fp8 bytes")
  message(FATAL_ERROR "the installed example failed (${rc}): ${out}")
endif()

# The CMake package: find_package(kvserde) and kvserde::kvserde.
set(consumer ${prefix}/consumer)
file(WRITE ${consumer}/CMakeLists.txt "cmake_minimum_required(VERSION 3.18)
project(consumer C)
find_package(kvserde 0.1 REQUIRED)
add_executable(example ${EXAMPLE})
target_link_libraries(example PRIVATE kvserde::kvserde)
")
execute_process(COMMAND ${CMAKE_COMMAND} -S ${consumer} -B ${consumer}/build
                        -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_C_COMPILER=${CC}
                        "-DCMAKE_C_FLAGS=${EXTRA_CFLAGS}"
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc EQUAL 0)
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${consumer}/build RESULT_VARIABLE rc
                  OUTPUT_QUIET)
endif()
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "find_package(kvserde) with the installed package failed")
endif()
execute_process(COMMAND ${consumer}/build/example OUTPUT_VARIABLE out2 RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT out2 MATCHES "32 bf16 bytes -> 16 fp8 bytes")
  message(FATAL_ERROR "the example built with find_package failed (${rc}): ${out2}")
endif()
message(STATUS "installed, then built and ran with pkg-config and find_package: ${out}")
