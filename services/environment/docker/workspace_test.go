package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"google.golang.org/grpc/codes"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment"
	"github.com/secbear/neuron/services/environment/workspace"
)

// TestWorkspaceVolumes runs invocations with workspaces that last
// through a private dockerd and the real operator image: a file one run
// of a session writes is read by its next run and by the file API, not
// by another session's run; the volume carries its labels; file paths
// that leave the workspace are refused; the cap holds; the retention
// sweep removes a volume nobody used.
func TestWorkspaceVolumes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a dockerd and builds the operator image")
	}
	if _, err := os.Stat(caBundle); err != nil {
		t.Skipf("no CA bundle at %s for the image: apt-get install ca-certificates", caBundle)
	}
	eng := testenv.Docker(t)
	bin := testenv.BuildStatic(t, operatorPkg)
	cli, err := client.New(client.WithHost(eng.Host))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	buildImage(t, cli, "../../operator/Dockerfile", bin, testImage)
	b, err := New(Config{Host: eng.Host, DefaultImage: testImage, OperatorArgs: []string{"--tools", "read,write,edit", "--model-retries", "0"}, WorkDir: shortDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	store, err := workspace.Open(t.TempDir(), 1<<20, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	// tool runs one tool call as a run of session sess, through the
	// scripted model's "/tool" rule, and returns the answer's text.
	// The session names the workspace; the input carries none (this
	// operator has no state service to read its history from).
	tool := func(t *testing.T, id, sess, name string, args map[string]any) (string, error) {
		t.Helper()
		raw, _ := json.Marshal(args)
		inv := invocation(t, id, &operatorv1.OperatorInput{Message: content.Text("/tool " + name + " " + string(raw))})
		inv.Workspace = environment.NewWorkspace(workspace.SessionName(sess), store)
		res, err := b.Run(ctx, inv)
		if err != nil {
			return "", err
		}
		return content.TextOf(res.Output.GetMessage()), nil
	}
	s1, s2 := workspace.SessionName("s1"), workspace.SessionName("s2")

	t.Run("lasts across runs of a session", func(t *testing.T) {
		out, err := tool(t, "w1", "s1", "write", map[string]any{"path": "sub/notes.md", "content": "hello from run one"})
		if err != nil || !strings.Contains(out, "Created") {
			t.Fatalf("run 1: %v (%s)", err, out)
		}
		if out, err := tool(t, "w2", "s1", "read", map[string]any{"path": "sub/notes.md"}); err != nil || !strings.Contains(out, "hello from run one") {
			t.Fatalf("run 2 of the session did not read run 1's file: %q, %v", out, err)
		}
		if out, _ := tool(t, "w3", "s2", "read", map[string]any{"path": "sub/notes.md"}); strings.Contains(out, "hello from run one") {
			t.Fatalf("another session's run read the file: %q", out)
		}
		var buf bytes.Buffer
		if err := b.ReadWorkspace(ctx, s1, "sub/notes.md", &buf); err != nil || buf.String() != "hello from run one" {
			t.Fatalf("ReadWorkspace: %q, %v", buf.String(), err)
		}
		if err := b.ReadWorkspace(ctx, s2, "sub/notes.md", &buf); code(err) != codes.NotFound {
			t.Fatalf("ReadWorkspace of the other session: %v, want NOT_FOUND", err)
		}
		files, _, total, err := b.ListWorkspace(ctx, s1, "")
		if err != nil || len(files) != 2 || files[0].GetPath() != "sub" || !files[0].GetDirectory() || files[1].GetPath() != "sub/notes.md" || total != uint64(len("hello from run one")) {
			t.Fatalf("ListWorkspace: %v, total %d, %v", files, total, err)
		}
		v, err := cli.VolumeInspect(ctx, VolumeName(s1), client.VolumeInspectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if l := v.Volume.Labels; l[LabelWorkspace] != s1 || l[LabelOwner] != "session" || l[LabelCreated] == "" {
			t.Fatalf("volume labels %v", l)
		}
		if left := containers(t, cli); len(left) != 0 {
			t.Fatalf("%d containers left behind", len(left))
		}
	})

	t.Run("upload is seen by the next run", func(t *testing.T) {
		n, err := b.WriteWorkspace(ctx, s1, "in/upload.txt", 0o600, strings.NewReader("uploaded"), store.Cap())
		if err != nil || n != int64(len("uploaded")) {
			t.Fatalf("WriteWorkspace: %d, %v", n, err)
		}
		if out, err := tool(t, "w4", "s1", "read", map[string]any{"path": "in/upload.txt"}); err != nil || !strings.Contains(out, "uploaded") {
			t.Fatalf("the run did not read the upload: %q, %v", out, err)
		}
		// The operator may write where the upload made directories.
		if out, err := tool(t, "w5", "s1", "write", map[string]any{"path": "in/more.txt", "content": "x"}); err != nil || strings.Contains(strings.ToLower(out), "permission denied") {
			t.Fatalf("run writing beside the upload: %q, %v", out, err)
		}
	})

	t.Run("paths leaving the workspace are refused", func(t *testing.T) {
		for _, p := range []string{"../etc/passwd", "/etc/passwd", "sub/../../x", ""} {
			if err := b.ReadWorkspace(ctx, s1, p, &bytes.Buffer{}); code(err) != codes.InvalidArgument {
				t.Errorf("ReadWorkspace(%q): %v, want INVALID_ARGUMENT", p, err)
			}
			if _, err := b.WriteWorkspace(ctx, s1, p, 0, strings.NewReader("x"), store.Cap()); code(err) != codes.InvalidArgument {
				t.Errorf("WriteWorkspace(%q): %v, want INVALID_ARGUMENT", p, err)
			}
		}
		if _, _, _, err := b.ListWorkspace(ctx, s1, "../"); code(err) != codes.InvalidArgument {
			t.Errorf("ListWorkspace(..): %v", err)
		}
		// A link the run left is not followed: it would resolve in the
		// container's root, outside the workspace.
		if _, err := b.WriteWorkspace(ctx, s1, "etc-link-target", 0, strings.NewReader("x"), store.Cap()); err != nil {
			t.Fatal(err)
		}
		linkTar(t, cli, b, s1, "leak", "/etc")
		if err := b.ReadWorkspace(ctx, s1, "leak/passwd", &bytes.Buffer{}); code(err) != codes.FailedPrecondition {
			t.Errorf("ReadWorkspace through a link: %v, want FAILED_PRECONDITION", err)
		}
		if _, err := b.WriteWorkspace(ctx, s1, "leak/evil", 0, strings.NewReader("x"), store.Cap()); code(err) != codes.FailedPrecondition {
			t.Errorf("WriteWorkspace through a link: %v, want FAILED_PRECONDITION", err)
		}
	})

	t.Run("size cap", func(t *testing.T) {
		big := strings.Repeat("x", 2<<20)
		if _, err := b.WriteWorkspace(ctx, s1, "big", 0, strings.NewReader(big), store.Cap()); code(err) != codes.ResourceExhausted {
			t.Fatalf("upload past the cap: %v, want RESOURCE_EXHAUSTED", err)
		}
		s3 := workspace.SessionName("s3")
		_, err := tool(t, "w6", "s3", "write", map[string]any{"path": "big", "content": big})
		if code(err) != codes.ResourceExhausted {
			t.Fatalf("run leaving the workspace past its cap: %v, want RESOURCE_EXHAUSTED", err)
		}
		if _, err := tool(t, "w7", "s3", "read", map[string]any{"path": "big"}); code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "before the run") {
			t.Fatalf("run of a workspace past its cap: %v, want RESOURCE_EXHAUSTED before the run", err)
		}
		if existed, err := b.DeleteWorkspace(ctx, s3); err != nil || !existed {
			t.Fatalf("DeleteWorkspace: %v, %v", existed, err)
		}
	})

	t.Run("retention", func(t *testing.T) {
		if n := b.SweepWorkspaces(ctx, time.Now(), time.Hour); n != 0 {
			t.Fatalf("the sweep removed %d volumes used just now", n)
		}
		if n := b.SweepWorkspaces(ctx, time.Now().Add(2*time.Hour), time.Hour); n != 2 {
			t.Fatalf("the sweep two hours on removed %d volumes, want 2 (s1, s2)", n)
		}
		if ok, err := b.HasWorkspace(ctx, s1); err != nil || ok {
			t.Fatalf("HasWorkspace after the sweep: %v, %v", ok, err)
		}
		res, err := cli.VolumeList(ctx, client.VolumeListOptions{})
		if err != nil || len(res.Items) != 0 {
			t.Fatalf("volumes left: %v, %v", res.Items, err)
		}
	})
}

// code is the gRPC code of err.
func code(err error) codes.Code { return errs.Code(err) }

// symlinkTar is a tar stream of one symbolic link.
func symlinkTar(name, target string) io.Reader {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777})
	_ = tw.Close()
	return &buf
}

// linkTar puts a symbolic link name -> target in workspace n's volume,
// as a run could.
func linkTar(t *testing.T, cli *client.Client, b *Backend, n, name, target string) {
	t.Helper()
	ctx := context.Background()
	err := b.withHelper(ctx, n, true, func(id string) error {
		_, err := cli.CopyToContainer(ctx, id, client.CopyToContainerOptions{DestinationPath: Workspace, Content: symlinkTar(name, target)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
