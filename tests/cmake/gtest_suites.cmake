# Read by ctest (fd_gtest_suites in tests/CMakeLists.txt writes the include file that sets FD_SUITES_* and includes this):
# one ctest test per GoogleTest suite of FD_SUITES_EXE, or per FD_SUITES_BATCH consecutive suites, named
# "<target>:<Suite>.*[:<Suite>.*...]" (two executables may have suites of the same name) and run as
# `EXE --gtest_filter=<Suite>.*[:...]`, with the properties FD_SUITES_PROPERTIES (KEY VALUE ...) and, when
# FD_SUITES_TIMEOUT_PER_TEST is set, a TIMEOUT of that many seconds per GoogleTest case it runs. One whose cases all
# skipped (exit 0, none ran to completion) exits 77, SKIP_RETURN_CODE: "Skipped" in ctest's list, as gtest_discover_tests
# lists a skipped case, never a silent pass. The suites are read from the executable when ctest runs (as
# gtest_discover_tests' PRE_TEST mode does), kept in FD_SUITES_FILE, and read again when the executable, this script or
# the include file is newer. FD_SUITES_FILTER (a --gtest_filter): only the suites it lists.
#
# FD_SUITES_CASES: each case also has its own entry, named as gtest_discover_tests names it ("<Suite>.<Case>"), run
# after its batch's (DEPENDS) by tests/cmake/case_result.sh: Passed, Skipped with its reason, or Failed, as the case
# did in the batch's run in this ctest invocation (the executable links tests/unit/case_results.cpp, which writes each
# case's outcome to FD_CASE_RESULTS, with the run id FD_CASE_RUN_ID made here when ctest starts). So a case that
# skipped beside others that ran is a skip in ctest's count, while the batch shares one process (and what its cases
# can share: the kernel grids' data per shape).
if(NOT EXISTS "${FD_SUITES_EXE}")
  add_test("${FD_SUITES_TARGET}_NOT_BUILT" "${FD_SUITES_TARGET}_NOT_BUILT")
  return()
endif()

if(NOT EXISTS "${FD_SUITES_FILE}" OR NOT "${FD_SUITES_FILE}" IS_NEWER_THAN "${FD_SUITES_EXE}"
   OR NOT "${FD_SUITES_FILE}" IS_NEWER_THAN "${CMAKE_CURRENT_LIST_FILE}"
   OR NOT "${FD_SUITES_FILE}" IS_NEWER_THAN "${FD_SUITES_INCLUDE}")
  set(filter_arg "")
  if(FD_SUITES_FILTER)
    set(filter_arg "--gtest_filter=${FD_SUITES_FILTER}")
  endif()
  execute_process(COMMAND "${FD_SUITES_EXE}" --gtest_list_tests ${filter_arg} WORKING_DIRECTORY "${FD_SUITES_WORKDIR}" TIMEOUT 60
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
      set(cases_${suite} "")
    elseif(line MATCHES "^  ([^ ]+)" AND DEFINED suite)
      math(EXPR count_${suite} "${count_${suite}} + 1")
      list(APPEND cases_${suite} "${CMAKE_MATCH_1}")
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
  # With FD_SUITES_CASES: EXE DIR RUN_ID --gtest_filter=...; each case's outcome into DIR (emptied first).
  set(run_cases [=[d=$1 id=$2; shift 2; mkdir -p "$d" && rm -f "$d"/* || exit 1; f=$(mktemp) || exit 1; FD_CASE_RESULTS=$d FD_CASE_RUN_ID=$id "$0" "$@" --gtest_output=json:"$f"; rc=$?; if [ "$rc" -eq 0 ] && ! grep -q '"result": "COMPLETED"' "$f"; then echo "(every test skipped)"; rc=77; fi; rm -f "$f"; exit "$rc"]=])
  # The case entries' labels: the batch's.
  set(case_labels "")
  list(FIND FD_SUITES_PROPERTIES LABELS at)
  if(at GREATER -1)
    math(EXPR at "${at} + 1")
    list(GET FD_SUITES_PROPERTIES ${at} case_labels)
    set(case_labels " LABELS [==[${case_labels}]==]")
  endif()
  # FD_SUITES_BATCH (default 1) consecutive suites to a test: `--gtest_filter=A.*:B.*`, named "<target>:A.*:B.*".
  if(NOT FD_SUITES_BATCH)
    set(FD_SUITES_BATCH 1)
  endif()
  list(LENGTH suites n_suites)
  set(script "")
  set(i 0)
  set(batch 0)
  while(i LESS n_suites)
    set(filter "")
    set(tests 0)
    set(batch_cases "")
    set(j 0)
    while(j LESS FD_SUITES_BATCH AND i LESS n_suites)
      list(GET suites ${i} s)
      if(NOT filter STREQUAL "")
        string(APPEND filter ":")
      endif()
      string(APPEND filter "${s}.*")
      math(EXPR tests "${tests} + ${count_${s}}")
      foreach(c IN LISTS cases_${s})
        list(APPEND batch_cases "${s}.${c}")
      endforeach()
      math(EXPR i "${i} + 1")
      math(EXPR j "${j} + 1")
    endwhile()
    set(name "${FD_SUITES_TARGET}:${filter}")
    set(timeout "")
    if(FD_SUITES_TIMEOUT_PER_TEST)
      math(EXPR t "${FD_SUITES_TIMEOUT_PER_TEST} * ${tests}")
      set(timeout " TIMEOUT ${t}")
    endif()
    if(FD_SUITES_CASES)
      set(dir "${FD_SUITES_WORKDIR}/${FD_SUITES_TARGET}_cases/${batch}")
      string(APPEND script
        "add_test([==[${name}]==] /bin/sh -c [==[${run_cases}]==] [==[${FD_SUITES_EXE}]==] [==[${dir}]==] \"\${FD_SUITES_RUN_ID}\" [==[--gtest_filter=${filter}]==])\n")
      foreach(c IN LISTS batch_cases)
        string(REPLACE "/" "%" key "${c}")
        string(APPEND script
          "add_test([==[${c}]==] /bin/sh [==[${FD_SUITES_REPORT}]==] [==[${dir}/${key}]==] \"\${FD_SUITES_RUN_ID}\" [==[${name}]==])\n"
          "set_tests_properties([==[${c}]==] PROPERTIES DEPENDS [==[${name}]==] SKIP_RETURN_CODE 77${case_labels})\n")
      endforeach()
    else()
      string(APPEND script
        "add_test([==[${name}]==] /bin/sh -c [==[${run}]==] [==[${FD_SUITES_EXE}]==] [==[--gtest_filter=${filter}]==])\n")
    endif()
    string(APPEND script
      "set_tests_properties([==[${name}]==] PROPERTIES WORKING_DIRECTORY [==[${FD_SUITES_WORKDIR}]==] SKIP_RETURN_CODE 77${timeout}${props})\n")
    math(EXPR batch "${batch} + 1")
  endwhile()
  file(WRITE "${FD_SUITES_FILE}" "${script}")
endif()
# This ctest invocation's run id (FD_SUITES_CASES): a case entry reports only a result its batch wrote in this run.
string(TIMESTAMP FD_SUITES_RUN_ID "%Y%m%dT%H%M%S%f" UTC)
string(RANDOM LENGTH 8 _fd_rand)
string(APPEND FD_SUITES_RUN_ID "-${_fd_rand}")
include("${FD_SUITES_FILE}")
