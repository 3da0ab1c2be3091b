package testenv

import (
	"hash/fnv"
	"os"
	"strconv"
	"testing"
	"time"
)

// SeedEnv names the variable that replays a randomized test's run.
const SeedEnv = "NEURON_CRASH_SEED"

// Seed returns the seed of a randomized test (crash points, kill times):
// $NEURON_CRASH_SEED when set, else one from the test's name and the
// time. It is logged, so a failing run can be replayed.
func Seed(t testing.TB) uint64 {
	t.Helper()
	if s := os.Getenv(SeedEnv); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", SeedEnv, err)
		}
		t.Logf("seed %d (from %s)", seed, SeedEnv)
		return seed
	}
	h := fnv.New64a()
	h.Write([]byte(t.Name()))
	seed := h.Sum64() ^ uint64(time.Now().UnixNano())
	t.Logf("seed %d (replay with %s=%d)", seed, SeedEnv, seed)
	return seed
}
