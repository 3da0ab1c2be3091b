//go:build race

package hnsw

// raceEnabled: the race detector slows the graph's Go code several
// times over, so the recall test uses a smaller set.
const raceEnabled = true
