// Catch2 main for the integration tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
