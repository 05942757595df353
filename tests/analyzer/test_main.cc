// Catch2 main for the analyzer tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
