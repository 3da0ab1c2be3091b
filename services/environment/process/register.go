package process

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/secbear/neuron/pkg/sandbox"
	"github.com/secbear/neuron/services/environment"
)

// The environment service's Run builds this backend for "process"
// (--backend process, the default).
func init() { environment.RegisterBackend("process", fromConfig) }

// fromConfig builds the backend from the service's Config: the operator
// binary, its arguments and read-only paths, DataDir/work as the work
// directory and DefaultDiskBytes as the workspace cap. A host that cannot
// confine it is logged; its specs are refused then.
func fromConfig(cfg environment.Config) (environment.Backend, func(), error) {
	bin, err := operatorBinary(cfg.OperatorBinary)
	if err != nil {
		return nil, nil, err
	}
	work := filepath.Join(cfg.DataDir, "work")
	b, err := New(Config{
		OperatorBinary: bin,
		OperatorArgs:   cfg.OperatorArgs,
		WorkDir:        work,
		ReadOnly:       cfg.ReadOnly,
		DiskBytes:      cfg.DefaultDiskBytes,
		Log:            cfg.Log,
	})
	if err != nil {
		return nil, nil, err
	}
	if err := sandbox.Supported(); err != nil {
		cfg.Log.Warn("the process backend will refuse every spec: this kernel cannot confine it", "reason", err.Error())
	} else if err := sandbox.CgroupSupported(); err != nil {
		cfg.Log.Warn("the process backend will refuse every spec: no usable cgroup", "reason", err.Error())
	}
	cfg.Log.Info("backend", "name", "process", "operator", bin, "work_dir", work)
	return b, b.Close, nil
}

// operatorBinary finds the operator binary: the setting, else ./operator
// beside this executable, else operator on $PATH.
func operatorBinary(setting string) (string, error) {
	if setting != "" {
		return filepath.Abs(setting)
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "operator")
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	p, err := exec.LookPath("operator")
	if err != nil {
		return "", errors.New("no operator binary: pass --operator-binary, or put operator beside this binary or on $PATH (make build puts both in bin/)")
	}
	return filepath.Abs(p)
}
