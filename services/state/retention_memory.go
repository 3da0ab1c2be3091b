package state

import (
	"context"
	"slices"
)

// retentionScan implements retentionStore.
func (m *Memory) retentionScan(ctx context.Context, fn func(enc []byte, key string, rev uint64)) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return 0, errClosed
	}
	for _, ck := range m.keys {
		enc, key, err := splitKey([]byte(ck))
		if err != nil {
			continue
		}
		fn(enc, key, m.docs[ck].rev)
	}
	return m.seq, nil
}

// loadMarks implements retentionStore: a memory store keeps its marks in
// memory, like its data.
func (m *Memory) loadMarks() ([]retentionMark, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return slices.Clone(m.marks), nil
}

// saveMarks implements retentionStore.
func (m *Memory) saveMarks(marks []retentionMark) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.marks = slices.Clone(marks)
	return nil
}
