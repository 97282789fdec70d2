# hardening.cmake - included at the end of the top-level CMakeLists.txt, once
# every test exists. What it adds is described in docs/hardening.md:
#   - OPENBLAS_NUM_THREADS=1 in the environment of every test;
#   - the sanitizer runtime options, in the environment of every test of a
#     KVS_SANITIZE build (so a report fails the test that caused it);
#   - the GNU ld --wrap options of tests/test_faults.c, the fault-injection
#     test (only that executable is wrapped);
#   - the libFuzzer targets fuzz/fuzz_*.c when KVS_BUILD_FUZZ is on.

# ---------------------------------------------------------------------------
# Sanitizer options for every test (test_*, examples, tool tests, ...)
# ---------------------------------------------------------------------------
set(KVS_ASAN_OPTIONS "detect_leaks=1:abort_on_error=1")
set(KVS_UBSAN_OPTIONS "halt_on_error=1:print_stacktrace=1")
set(KVS_TSAN_OPTIONS "halt_on_error=1:second_deadlock_stack=1")

# OpenBLAS (the transform stage) on the calling thread in every test: its
# own thread pool is not instrumented (TSan would see its hand-offs as races)
# and the tests' matrix products are small.
if(KVS_BUILD_TESTS)
  get_property(kvs_all_tests DIRECTORY ${PROJECT_SOURCE_DIR} PROPERTY TESTS)
  if(kvs_all_tests)
    set_property(TEST ${kvs_all_tests} APPEND PROPERTY ENVIRONMENT "OPENBLAS_NUM_THREADS=1")
  endif()
endif()

if(KVS_BUILD_TESTS AND NOT KVS_SANITIZE STREQUAL "")
  get_property(kvs_all_tests DIRECTORY ${PROJECT_SOURCE_DIR} PROPERTY TESTS)
  if(KVS_SANITIZE STREQUAL "address")
    set(kvs_san_env "ASAN_OPTIONS=${KVS_ASAN_OPTIONS}" "UBSAN_OPTIONS=${KVS_UBSAN_OPTIONS}")
  else()
    set(kvs_san_env "TSAN_OPTIONS=${KVS_TSAN_OPTIONS}")
  endif()
  if(kvs_all_tests)
    set_property(TEST ${kvs_all_tests} APPEND PROPERTY ENVIRONMENT ${kvs_san_env})
  endif()
endif()

# ---------------------------------------------------------------------------
# tests/test_faults.c: every call the library's objects make to these
# functions goes through the test's __wrap_* functions (GNU ld --wrap; the
# test links the static library). The list covers each allocation, file,
# eventfd, thread and randomness call that `nm -u libkvserde.a` shows; both
# spellings of the large-file calls are listed since hiredis' pkg-config flags
# turn on _FILE_OFFSET_BITS=64.
# ---------------------------------------------------------------------------
set(KVS_FAULT_WRAPPED_CALLS
  malloc calloc realloc aligned_alloc posix_memalign strdup strndup free
  eventfd pthread_create
  open open64 openat openat64 read pread pread64 write pwrite pwrite64
  fsync fdatasync rename renameat
  fstat fstat64 fstatat fstatat64 mkdir mkdirat unlinkat unlink flock
  fdopendir readdir readdir64 getrandom
  XXH3_createState XXH3_freeState)
if(KVS_BUILD_TESTS AND TARGET test_faults)
  set(kvs_wrap_flags "")
  foreach(fn ${KVS_FAULT_WRAPPED_CALLS})
    list(APPEND kvs_wrap_flags "LINKER:--wrap=${fn}")
  endforeach()
  target_link_options(test_faults PRIVATE ${kvs_wrap_flags})
  # The walk runs hundreds of store+load cycles; each has its own alarm.
  set_tests_properties(test_faults PROPERTIES TIMEOUT 1500)
endif()

# ---------------------------------------------------------------------------
# libFuzzer targets: every fuzz/fuzz_*.c is one executable (make fuzz runs
# them; fuzz/README.md). The safetensors reader lives in the tool, so its
# target compiles tools/safetensors.c and its name index (name_index.c) in.
# ---------------------------------------------------------------------------
if(KVS_BUILD_FUZZ)
  file(GLOB KVS_FUZZ_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/fuzz/fuzz_*.c)
  add_custom_target(fuzz_all)
  foreach(src ${KVS_FUZZ_SOURCES})
    get_filename_component(name ${src} NAME_WE)
    add_executable(${name} ${src})
    target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src
      ${PROJECT_SOURCE_DIR}/tools ${PROJECT_SOURCE_DIR}/fuzz)
    target_compile_options(${name} PRIVATE -fsanitize=fuzzer)
    target_link_options(${name} PRIVATE -fsanitize=fuzzer)
    target_link_libraries(${name} PRIVATE kvserde_static m)
    add_dependencies(fuzz_all ${name})
  endforeach()
  if(TARGET fuzz_safetensors)
    target_sources(fuzz_safetensors PRIVATE ${PROJECT_SOURCE_DIR}/tools/safetensors.c
      ${PROJECT_SOURCE_DIR}/tools/name_index.c)
  endif()
  # The seed corpora's generator (fuzz/seeds.c; fuzz/README.md): a plain
  # program, not a fuzz target.
  add_executable(kvs_fuzz_seeds ${PROJECT_SOURCE_DIR}/fuzz/seeds.c)
  target_link_libraries(kvs_fuzz_seeds PRIVATE kvserde_static)
endif()
