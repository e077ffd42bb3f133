// CPU lists (fastdecode/core/affinity.h): parsed as Linux writes them, printed back short, bad items named.
#include <gtest/gtest.h>

#include "fastdecode/core/affinity.h"
#include "fastdecode/core/error.h"

using namespace fd;

TEST(CpuList, ParsesRangesAndSinglesInOrder) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11", "x"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list("12-15", "x"), (std::vector<int>{12, 13, 14, 15}));
  EXPECT_EQ(parse_cpu_list("5", "x"), (std::vector<int>{5}));
}

TEST(CpuList, RefusesWhatIsNotAList) {
  for (const char* bad : {"", "x", "3-1", "-1", "1-", "1-2x", "2x", "0-999999", ",", "1,,2"}) {
    SCOPED_TRACE(bad);
    try {
      parse_cpu_list(bad, "engine.sworker_cpus");
      ADD_FAILURE() << "accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("engine.sworker_cpus"), std::string::npos) << e.what();
    }
  }
}

TEST(CpuList, PrintsBackShortSortedAndOnce) {
  EXPECT_EQ(cpu_list_string({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(cpu_list_string({15, 12, 13, 14, 12}), "12-15");
  EXPECT_EQ(cpu_list_string({}), "");
  EXPECT_EQ(parse_cpu_list(cpu_list_string({1, 4, 5, 9}), "x"), (std::vector<int>{1, 4, 5, 9}));
}
