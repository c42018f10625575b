package mad

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/softrnic/softrnic/internal/wire/wiretest"
)

// TestWriteFuzzSeeds regenerates testdata/fuzz/FuzzDecodeCM: one MAD of every message with
// random fields, its truncations, and each with another message's attribute.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("SOFTRNIC_WRITE_FUZZ_SEEDS") != "1" {
		t.Skip("set SOFTRNIC_WRITE_FUZZ_SEEDS=1 to regenerate testdata/fuzz")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzDecodeCM")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := wiretest.ClearSeeds(dir); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	write := func(name string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, "seed-"+name), wiretest.CorpusFile(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, mk := range messages() {
		m := mk()
		fill(rng, m)
		var b [Size]byte
		Put(b[:], rng.Uint64(), m)
		name := m.Attr().String()
		write(name, b[:])
		write(name+"-short", b[:Size-1])
		write(name+"-header-only", b[:HeaderLen])
		c := b
		c[17] = byte(AttrREP) // another attribute
		write(name+"-as-REP", c[:])
		c = b
		c[2] = 1 // class version 1
		write(name+"-classv1", c[:])
	}
	var rej [Size]byte
	Put(rej[:], 1, &REJ{InfoLength: REJInfoLen})
	rej[HeaderLen+9] = 0xFE // info length 127
	write("REJ-info-too-long", rej[:])
	var sidr [Size]byte
	Put(sidr[:], 1, &SIDRREP{InfoLength: SIDRREPInfoLen})
	sidr[HeaderLen+5] = SIDRREPInfoLen + 1
	write("SIDR_REP-info-too-long", sidr[:])
	fmt.Println("wrote", dir)
}
