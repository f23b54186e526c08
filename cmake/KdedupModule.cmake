# Build helpers shared by every module, test suite and benchmark.

# Compiler warnings for project code; errors too when KDEDUP_WERROR is on.
function(kdedup_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow
    -Wnon-virtual-dtor -Wcast-align -Wunused -Woverloaded-virtual
    -Wno-missing-field-initializers)
  # GCC 12 reports -Wrestrict false positives inside libstdc++'s string
  # concatenation at -O2/-O3 (GCC bug 105329, fixed in GCC 13).
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(${target} PRIVATE -Wno-restrict)
  endif()
  if(KDEDUP_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# Applies KDEDUP_SANITIZE to everything built after this call.
macro(kdedup_setup_sanitizers)
  if(KDEDUP_SANITIZE STREQUAL "address")
    add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer
      -fno-sanitize-recover=undefined)
    add_link_options(-fsanitize=address,undefined)
  elseif(KDEDUP_SANITIZE STREQUAL "thread")
    add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
    add_link_options(-fsanitize=thread)
    # librdkafka's C11 threads made visible to the sanitizer (see the file).
    add_library(kdedup_tsan_c11_threads OBJECT
      ${PROJECT_SOURCE_DIR}/cmake/sanitizers/tsan_c11_threads.c)
  elseif(NOT KDEDUP_SANITIZE STREQUAL "")
    message(FATAL_ERROR "KDEDUP_SANITIZE must be '', 'address' or 'thread'")
  endif()
endmacro()

# Links what a sanitizer needs into an executable (KDEDUP_SANITIZE=thread:
# librdkafka's C11 threads through the intercepted pthreads).
function(kdedup_sanitizer_runtime target)
  if(TARGET kdedup_tsan_c11_threads)
    target_sources(${target} PRIVATE $<TARGET_OBJECTS:kdedup_tsan_c11_threads>)
  endif()
endfunction()

# kdedup_module(<name> SOURCES ... [PUBLIC_DEPS ...] [PRIVATE_DEPS ...])
# Creates the static library kdedup_<name> with the alias kdedup::<name>.
# Public headers live in lib/include/kdedup/<name>/, sources in lib/src/<name>/.
function(kdedup_module name)
  cmake_parse_arguments(ARG "" "" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(kdedup_${name} STATIC ${ARG_SOURCES})
  add_library(kdedup::${name} ALIAS kdedup_${name})
  target_include_directories(kdedup_${name} PUBLIC ${PROJECT_SOURCE_DIR}/lib/include)
  target_link_libraries(kdedup_${name} PUBLIC ${ARG_PUBLIC_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  kdedup_warnings(kdedup_${name})
endfunction()

# kdedup_test(<name> LABEL unit|integration|e2e SOURCES ... [LIBS ...] [TIMEOUT s])
# One GoogleTest executable; every TEST becomes a CTest test with the label.
function(kdedup_test name)
  cmake_parse_arguments(ARG "" "LABEL;TIMEOUT" "SOURCES;LIBS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} kdedup::test_support GTest::gmock GTest::gtest_main)
  kdedup_warnings(${name})
  # A test's own code at -O1 in an optimised build: the code it tests (the
  # modules, test_support's stream generators) stays at -O3, and the test
  # files compile in two thirds of the time.
  target_compile_options(${name} PRIVATE $<$<CONFIG:Release>:-O1>)
  # Test files compile four to a translation unit: GoogleTest's and the
  # project's headers are parsed, and their templates instantiated, once
  # per four files, not once per file (a third less compile time; each
  # file's helpers therefore carry names of their own).
  set_target_properties(${name} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 4)
  kdedup_sanitizer_runtime(${name})
  target_compile_definitions(${name} PRIVATE
    KDEDUP_BINARY="${KDEDUP_BINARY}"
    KDEDUP_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  gtest_discover_tests(${name}
    PROPERTIES LABELS ${ARG_LABEL} TIMEOUT ${ARG_TIMEOUT}
    DISCOVERY_TIMEOUT 60)
  # Every executable of a suite, for `cmake --build --target <label>_tests`
  # (tests/CMakeLists.txt makes the targets).
  set_property(GLOBAL APPEND PROPERTY KDEDUP_${ARG_LABEL}_TESTS ${name})
endfunction()
