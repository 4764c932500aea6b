// Compiles the tests' shared precompiled header (tests/CMakeLists.txt, tessera_test_pch); the
// executable itself has no tests.
