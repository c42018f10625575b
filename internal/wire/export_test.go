package wire

// Test helpers of package wire for its external tests (package wire_test).

// LoadVectors returns the ICRC test vectors of testdata/roce-icrc-vectors.json.
var LoadVectors = loadVectors
