// Catch2 main for the core unit tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
