//go:build !linux

package pathbench

import "testing"

const notLinux = "the whole-path benchmark reads each process's CPU time and peak RSS from /proc: Linux only"

func BenchmarkPath(b *testing.B) { b.Skip(notLinux) }

func BenchmarkHandLoop(b *testing.B) { b.Skip(notLinux) }
