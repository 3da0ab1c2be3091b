package remote

import (
	"time"

	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
)

// Wants reports whether the boundary and phase are sent, for the tests.
func (m *Middleware) Wants(b middlewarev1.Boundary, ph middlewarev1.Phase) bool {
	return m.wants(b, ph)
}

// Settings are the timeout and fail policy in force, for the tests.
func (m *Middleware) Settings() (time.Duration, bool) { return m.timeout, m.failOpen }
