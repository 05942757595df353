// Catch2's main for the test programs, where the catch2 package has no compiled Catch2WithMain.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
