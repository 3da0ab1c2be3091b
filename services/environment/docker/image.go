package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/moby/moby/api/types/build"
	"github.com/moby/moby/client"
)

// CABundleName is the name of the CA bundle in a build context, what the
// services' Dockerfiles COPY to /etc/ssl/certs/ca-certificates.crt.
const CABundleName = "ca-certificates.crt"

// BuildContext returns a build context for the engine's image build API
// (an uncompressed tar stream) holding three files at its root: the
// Dockerfile at dockerfile as "Dockerfile", the binary under its own base
// name (mode 0755), and the CA bundle at caBundle as
// "ca-certificates.crt". That is the context the services' Dockerfiles
// expect, e.g. services/operator/Dockerfile with a binary named
// "operator".
//
// The Dockerfile and the CA bundle are read now; the binary, which can be
// large, is streamed from disk as the context is read, and must not
// change size meanwhile. Entries carry fixed ownership (0:0) and times,
// so the same files give the same context.
func BuildContext(dockerfile, binary, caBundle string) (io.Reader, error) {
	df, err := os.ReadFile(dockerfile)
	if err != nil {
		return nil, fmt.Errorf("build context: %w", err)
	}
	ca, err := os.ReadFile(caBundle)
	if err != nil {
		return nil, fmt.Errorf("build context: %w", err)
	}
	st, err := os.Stat(binary)
	if err != nil {
		return nil, fmt.Errorf("build context: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("build context: binary %s is not a regular file", binary)
	}
	name := filepath.Base(binary)
	if name == "Dockerfile" || name == CABundleName {
		return nil, fmt.Errorf("build context: binary %s would collide with the %s entry", binary, name)
	}

	var head bytes.Buffer
	tw := tar.NewWriter(&head)
	header := func(name string, mode, size int64) *tar.Header {
		return &tar.Header{
			Typeflag: tar.TypeReg,
			Name:     name,
			Mode:     mode,
			Size:     size,
			ModTime:  time.Unix(0, 0),
			Format:   tar.FormatUSTAR,
		}
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{"Dockerfile", df}, {CABundleName, ca}} {
		if err := tw.WriteHeader(header(f.name, 0o644, int64(len(f.data)))); err != nil {
			return nil, fmt.Errorf("build context: %w", err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, fmt.Errorf("build context: %w", err)
		}
	}
	// The binary's header goes out now, its content from the file, then
	// the padding to a whole block and the two zero blocks that end the
	// archive, written by hand because the tar.Writer never sees the
	// content.
	if err := tw.WriteHeader(header(name, 0o755, st.Size())); err != nil {
		return nil, fmt.Errorf("build context: %w", err)
	}
	const block = 512
	tail := make([]byte, (block-st.Size()%block)%block+2*block)
	return io.MultiReader(&head, &fileStream{path: binary, size: st.Size()}, bytes.NewReader(tail)), nil
}

// fileStream reads exactly size bytes of the file at path, opening it on
// the first Read and closing it at the end.
type fileStream struct {
	path string
	size int64
	f    *os.File
	r    io.Reader
	read int64
	done bool
}

func (s *fileStream) Read(p []byte) (int, error) {
	if s.done {
		return 0, io.EOF
	}
	if s.f == nil {
		f, err := os.Open(s.path)
		if err != nil {
			return 0, fmt.Errorf("build context: %w", err)
		}
		s.f, s.r = f, io.LimitReader(f, s.size)
	}
	n, err := s.r.Read(p)
	s.read += int64(n)
	if errors.Is(err, io.EOF) {
		s.done = true
		s.f.Close()
		if s.read != s.size {
			return n, fmt.Errorf("build context: %s shrank to %d bytes while it was read (%d expected): %w", s.path, s.read, s.size, io.ErrUnexpectedEOF)
		}
	}
	return n, err
}

// BuildImage builds the image tag from dockerfile, the binary and the CA
// bundle (see BuildContext) through the engine's build API, and checks the
// image exists afterwards. The error quotes the build's output.
func BuildImage(ctx context.Context, cli *client.Client, dockerfile, binary, caBundle, tag string) error {
	bc, err := BuildContext(dockerfile, binary, caBundle)
	if err != nil {
		return err
	}
	res, err := cli.ImageBuild(ctx, bc, client.ImageBuildOptions{
		Tags:        []string{tag},
		Remove:      true,
		ForceRemove: true,
		Version:     build.BuilderV1,
	})
	if err != nil {
		return fmt.Errorf("image build: %w", err)
	}
	defer res.Body.Close()
	var progress strings.Builder
	dec := json.NewDecoder(res.Body)
	for {
		var msg struct {
			Stream string `json:"stream"`
			Error  string `json:"error"`
		}
		if err := dec.Decode(&msg); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return fmt.Errorf("image build output: %v\n%s", err, progress.String())
		}
		progress.WriteString(msg.Stream)
		if msg.Error != "" {
			return fmt.Errorf("image build: %s\n%s", msg.Error, progress.String())
		}
	}
	if _, err := cli.ImageInspect(ctx, tag); err != nil {
		return fmt.Errorf("image %s after the build: %v\n%s", tag, err, progress.String())
	}
	return nil
}
