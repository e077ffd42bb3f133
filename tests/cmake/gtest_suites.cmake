# Read by ctest (fd_gtest_suites in tests/CMakeLists.txt writes the include file that sets FD_SUITES_* and includes this):
# one ctest test per GoogleTest suite of FD_SUITES_EXE, or per FD_SUITES_BATCH consecutive suites, named
# "<target>:<Suite>.*[:<Suite>.*...]" (two executables may have suites of the same name) and run as
# `EXE --gtest_filter=<Suite>.*[:...]`, with the properties FD_SUITES_PROPERTIES (KEY VALUE ...) and, when
# FD_SUITES_TIMEOUT_PER_TEST is set, a TIMEOUT of that many seconds per GoogleTest case it runs. One whose cases all
# skipped (exit 0, none ran to completion) exits 77, SKIP_RETURN_CODE: "Skipped" in ctest's list, as gtest_discover_tests
# lists a skipped case, never a silent pass. The suites are read from the executable when ctest runs (as
# gtest_discover_tests' PRE_TEST mode does), kept in FD_SUITES_FILE, and read again when the executable, this script or
# the include file is newer.
if(NOT EXISTS "${FD_SUITES_EXE}")
  add_test("${FD_SUITES_TARGET}_NOT_BUILT" "${FD_SUITES_TARGET}_NOT_BUILT")
  return()
endif()

if(NOT EXISTS "${FD_SUITES_FILE}" OR NOT "${FD_SUITES_FILE}" IS_NEWER_THAN "${FD_SUITES_EXE}"
   OR NOT "${FD_SUITES_FILE}" IS_NEWER_THAN "${CMAKE_CURRENT_LIST_FILE}"
   OR NOT "${FD_SUITES_FILE}" IS_NEWER_THAN "${FD_SUITES_INCLUDE}")
  execute_process(COMMAND "${FD_SUITES_EXE}" --gtest_list_tests WORKING_DIRECTORY "${FD_SUITES_WORKDIR}" TIMEOUT 60
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${FD_SUITES_EXE} --gtest_list_tests failed (${rc}):\n${out}\n${err}")
  endif()
  # One list element per line (a parameter's printed value may hold ';' or brackets, which a CMake list would split on).
  string(REGEX REPLACE "[][;]" "_" out "${out}")
  string(REPLACE "\n" ";" lines "${out}")
  # A suite line starts the line ("Suite." or "Prefix/Suite.", maybe then "  # TypeParam = ..."); its tests are indented.
  set(suites "")
  foreach(line IN LISTS lines)
    if(line MATCHES "^([A-Za-z_][A-Za-z0-9_/]*)\\.")
      set(suite "${CMAKE_MATCH_1}")
      list(APPEND suites "${suite}")
      set(count_${suite} 0)
    elseif(line MATCHES "^  [^ ]" AND DEFINED suite)
      math(EXPR count_${suite} "${count_${suite}} + 1")
    endif()
  endforeach()
  if(NOT suites)
    message(FATAL_ERROR "${FD_SUITES_EXE} --gtest_list_tests listed no suite:\n${out}")
  endif()
  set(props "")
  foreach(p IN LISTS FD_SUITES_PROPERTIES)
    string(APPEND props " [==[${p}]==]")
  endforeach()
  # EXE --gtest_filter=S.* --gtest_output=json:TMP; the report says whether any test ran to completion (passed or failed).
  set(run [=[f=$(mktemp) || exit 1; "$0" "$@" --gtest_output=json:"$f"; rc=$?; if [ "$rc" -eq 0 ] && ! grep -q '"result": "COMPLETED"' "$f"; then echo "(every test skipped)"; rc=77; fi; rm -f "$f"; exit "$rc"]=])
  # FD_SUITES_BATCH (default 1) consecutive suites to a test: `--gtest_filter=A.*:B.*`, named "<target>:A.*:B.*".
  if(NOT FD_SUITES_BATCH)
    set(FD_SUITES_BATCH 1)
  endif()
  list(LENGTH suites n_suites)
  set(script "")
  set(i 0)
  while(i LESS n_suites)
    set(filter "")
    set(tests 0)
    set(j 0)
    while(j LESS FD_SUITES_BATCH AND i LESS n_suites)
      list(GET suites ${i} s)
      if(NOT filter STREQUAL "")
        string(APPEND filter ":")
      endif()
      string(APPEND filter "${s}.*")
      math(EXPR tests "${tests} + ${count_${s}}")
      math(EXPR i "${i} + 1")
      math(EXPR j "${j} + 1")
    endwhile()
    set(name "${FD_SUITES_TARGET}:${filter}")
    set(timeout "")
    if(FD_SUITES_TIMEOUT_PER_TEST)
      math(EXPR t "${FD_SUITES_TIMEOUT_PER_TEST} * ${tests}")
      set(timeout " TIMEOUT ${t}")
    endif()
    string(APPEND script
      "add_test([==[${name}]==] /bin/sh -c [==[${run}]==] [==[${FD_SUITES_EXE}]==] [==[--gtest_filter=${filter}]==])\n"
      "set_tests_properties([==[${name}]==] PROPERTIES WORKING_DIRECTORY [==[${FD_SUITES_WORKDIR}]==] SKIP_RETURN_CODE 77${timeout}${props})\n")
  endwhile()
  file(WRITE "${FD_SUITES_FILE}" "${script}")
endif()
include("${FD_SUITES_FILE}")
