// Each GoogleTest case's outcome in a file, for ctest's entry of that case when a batch of cases runs in one process
// (fd_gtest_suites' CASES, tests/cmake/gtest_suites.cmake): with FD_CASE_RESULTS=DIR and FD_CASE_RUN_ID=ID set, every
// case that ends writes DIR/<Suite.Case, '/' as '%'>: "ID passed|skipped|failed", then the skip's message or the
// failures. tests/cmake/case_result.sh reports it (Passed, Skipped with the reason, Failed). Unset: nothing is written.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>

namespace {

class CaseResults : public ::testing::EmptyTestEventListener {
 public:
  CaseResults(std::string dir, std::string run_id) : dir_(std::move(dir)), run_id_(std::move(run_id)) {}

  void OnTestEnd(const ::testing::TestInfo& info) override {
    const ::testing::TestResult& r = *info.result();
    std::string key = std::string(info.test_suite_name()) + "." + info.name();
    for (char& c : key)
      if (c == '/') c = '%';
    const char* outcome = r.Failed() ? "failed" : r.Skipped() ? "skipped" : "passed";
    std::string detail;
    for (int i = 0; i < r.total_part_count(); ++i) {
      const ::testing::TestPartResult& p = r.GetTestPartResult(i);
      if (r.Failed() ? p.failed() : p.skipped()) {
        if (!detail.empty()) detail += "\n";
        if (r.Failed() && p.file_name()) detail += std::string(p.file_name()) + ":" + std::to_string(p.line_number()) + ": ";
        detail += p.message();
      }
    }
    std::ofstream(dir_ + "/" + key) << run_id_ << " " << outcome << "\n" << detail << "\n";
  }

 private:
  std::string dir_, run_id_;
};

// Installed before main (gtest_main) runs the cases; the UnitTest singleton owns the listener.
const bool installed = [] {
  const char* dir = std::getenv("FD_CASE_RESULTS");
  if (!dir || !*dir) return false;
  const char* id = std::getenv("FD_CASE_RUN_ID");
  ::testing::UnitTest::GetInstance()->listeners().Append(new CaseResults(dir, id ? id : ""));
  return true;
}();

}  // namespace
