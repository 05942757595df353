// Catch2 main of the pool tests (kept in its own file so the test files rebuild fast).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
