# Read by ctest (tests/CMakeLists.txt writes the include file that sets FD_PYTEST_* and includes this): the pytest
# entries, with every case's skip visible in ctest's count.
#
# * pytest.<stem>: one per test file (FD_PYTEST_FILES), running the whole file in one process as before (no process per
#   case: CI's 2 cores), "Passed" when a case passed and none failed, "Failed" when one failed, "Skipped" (77) when none
#   ran (every case, or the module, skipped). The plugin tests/python/fd_skip_status.py writes each case's outcome
#   (passed / skipped with its reason / failed) to FD_PYTEST_OUT/results/<stem>/<key>.
# * pytest.<stem>::<case id>: one per collected case, after its file's entry (DEPENDS), running
#   tests/cmake/case_result.sh (a shell and a file read, no Python): Passed, Skipped with the reason printed
#   (SKIP_RETURN_CODE 77), or Failed, as the case did in this ctest invocation (a run id made here, checked against the
#   result: a case selected without its file's entry fails, saying so, never reports an old run).
#
# Which cases exist is known only by collecting the files, so it is done here, when ctest starts (as
# gtest_discover_tests' PRE_TEST mode lists a GoogleTest executable): one `pytest --collect-only` over every file
# (4 CPU-seconds on the 2-core development machine), kept in FD_PYTEST_OUT/cases/ and done again when a file under
# tests/python, this script or the include file is newer. A file's run compares what it collects with that list and fails on a difference
# (removing the list, so that the next ctest collects again): no case runs without its own entry. A file that fails
# to collect has only its file's entry, which fails.
set(_cases_dir "${FD_PYTEST_OUT}/cases")
set(_cases_file "${_cases_dir}/cases.cmake")
file(GLOB _inputs "${FD_PYTEST_DIR}/*.py")
list(APPEND _inputs "${CMAKE_CURRENT_LIST_FILE}" "${FD_PYTEST_INCLUDE}")
set(_stale FALSE)
if(NOT EXISTS "${_cases_file}")
  set(_stale TRUE)
endif()
foreach(_f IN LISTS _inputs)
  if(NOT "${_cases_file}" IS_NEWER_THAN "${_f}")
    set(_stale TRUE)
  endif()
endforeach()
if(_stale)
  file(REMOVE_RECURSE "${_cases_dir}")
  execute_process(COMMAND "${FD_PYTEST_CMAKE}" -E env ${FD_PYTEST_ENV} "FD_PYTEST_COLLECT_OUT=${_cases_dir}"
                          "${FD_PYTEST_PYTHON}" -m pytest --collect-only -q -p no:cacheprovider
                          --continue-on-collection-errors ${FD_PYTEST_FILES}
                  WORKING_DIRECTORY "${FD_PYTEST_WORKDIR}" TIMEOUT 120
                  OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc)
  if(NOT EXISTS "${_cases_file}")
    message(WARNING "pytest's collection at ctest start wrote no case list (exit ${_rc}): each test file has only its "
                    "file's entry.\n${_out}\n${_err}")
  elseif(NOT _rc EQUAL 0 AND NOT _rc EQUAL 77)
    message(WARNING "pytest's collection at ctest start (exit ${_rc}): a file that did not collect has only its "
                    "file's entry (which fails).\n${_err}")
  endif()
endif()

# This ctest invocation's run id: a case entry reports only a result its file's entry wrote in this invocation.
string(TIMESTAMP _run_id "%Y%m%dT%H%M%S%f" UTC)
string(RANDOM LENGTH 8 _rand)
string(APPEND _run_id "-${_rand}")

foreach(_f IN LISTS FD_PYTEST_FILES)
  get_filename_component(_stem "${_f}" NAME_WE)
  add_test("pytest.${_stem}" "${FD_PYTEST_PYTHON}" -m pytest -q -rs -p no:cacheprovider "${_f}")
  # COST: started before the short C++ tests (a clean clone has no timing history), so that ctest -j packs them.
  set_tests_properties("pytest.${_stem}" PROPERTIES LABELS python COST 30 SKIP_RETURN_CODE 77
                       WORKING_DIRECTORY "${FD_PYTEST_WORKDIR}"
                       ENVIRONMENT "${FD_PYTEST_ENV};FD_PYTEST_RESULTS=${FD_PYTEST_OUT}/results/${_stem};FD_PYTEST_RUN_ID=${_run_id};FD_PYTEST_CASES=${_cases_dir}/${_stem}.cases;FD_PYTEST_STALE=${_cases_file}")
endforeach()

# Called once per collected case by the list (FD_PYTEST_COLLECT_OUT in fd_skip_status.py).
function(fd_pytest_case stem case_id key)
  string(REPLACE ";" "," _name "pytest.${stem}::${case_id}")
  add_test("${_name}" /bin/sh "${FD_PYTEST_REPORT}" "${FD_PYTEST_OUT}/results/${stem}/${key}" "${_run_id}"
           "pytest.${stem}")
  set_tests_properties("${_name}" PROPERTIES LABELS python DEPENDS "pytest.${stem}" SKIP_RETURN_CODE 77)
endfunction()
include("${_cases_file}" OPTIONAL)
