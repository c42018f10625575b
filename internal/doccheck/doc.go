// Package doccheck holds no code: its test compiles every Go block of README.md and
// docs/*.md against the module, so that the documentation's programs and fragments stay
// true to the API as it changes. See TestGoBlocks for the conventions a block follows.
package doccheck
