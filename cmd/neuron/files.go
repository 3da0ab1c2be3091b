package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
)

const filesHelp = `List, download and upload the files of a workspace that lasts, kept by
the environment service: a workflow's (--workflow ID) or a session's
(--session ID), for agents whose spec says workspace: {scope:
WORKSPACE_SCOPE_WORKFLOW} (or SESSION). Paths are relative to the
workspace; "..", absolute paths and links leaving it are refused.

  ls [DIR]                  the files under DIR (default: all), recursively
  get PATH [DEST]           print the file, or write it to DEST ("-": stdout)
  put SRC PATH              upload SRC ("-": stdin) as PATH, replacing it
  rm                        remove the whole workspace

After the demo of 'neuron up':
  neuron files ls --workflow demo-...
  neuron files get notes.md --workflow demo-...`

// cmdFiles is `neuron files`: workspace files on the environment service.
func (c *cli) cmdFiles(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprintf(c.stderr, "Usage: neuron files ls|get|put|rm [flags]\n\n%s\n", filesHelp)
		return &exitError{code: exitUsage}
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintf(c.stdout, "Usage: neuron files ls|get|put|rm [flags]\n\n%s\n", filesHelp)
		return nil
	}
	sub, args := args[0], args[1:]
	name := "files " + sub
	synopses := map[string]string{
		"ls":  "neuron files ls [DIR] --workflow ID|--session ID [flags]",
		"get": "neuron files get PATH [DEST] --workflow ID|--session ID [flags]",
		"put": "neuron files put SRC PATH --workflow ID|--session ID [--mode 0644] [flags]",
		"rm":  "neuron files rm --workflow ID|--session ID [flags]",
	}
	synopsis, ok := synopses[sub]
	if !ok {
		return usageErrorf("files", "unknown subcommand %q: want ls, get, put or rm", sub)
	}
	var (
		cn                conn
		workflow, session string
		mode              uint
	)
	fs := newFlagSet(name, synopsis, filesHelp, c.stdout)
	cn.bind(fs, c, "environment service", "NEURON_ENVIRONMENT_ADDR", defaultEnvironmentAddr, 5*time.Minute)
	fs.StringVar(&workflow, "workflow", "", "the workspace of this workflow")
	fs.StringVar(&session, "session", "", "the workspace of this session")
	if sub == "put" {
		fs.UintVar(&mode, "mode", 0o644, "the file's permission bits")
	}
	pos, err := parseArgs(fs, name, args)
	if err != nil {
		return err
	}
	counts := map[string][2]int{"ls": {0, 1}, "get": {1, 2}, "put": {2, 2}, "rm": {0, 0}}[sub]
	if len(pos) < counts[0] || len(pos) > counts[1] {
		return usageErrorf(name, "wrong number of arguments: %s", synopsis)
	}
	var ref *environmentv1.WorkspaceRef
	switch {
	case workflow != "" && session != "":
		return usageErrorf(name, "name one workspace: --workflow or --session, not both")
	case workflow != "":
		ref = &environmentv1.WorkspaceRef{Kind: &environmentv1.WorkspaceRef_WorkflowId{WorkflowId: workflow}}
	case session != "":
		ref = &environmentv1.WorkspaceRef{Kind: &environmentv1.WorkspaceRef_SessionId{SessionId: session}}
	default:
		return usageErrorf(name, "name a workspace: --workflow ID or --session ID")
	}
	if mode > 0o777 {
		return usageErrorf(name, "--mode %o: want permission bits, at most 0777", mode)
	}
	cc, err := cn.dial()
	if err != nil {
		return err
	}
	defer cc.Close()
	cn.hints = map[codes.Code]string{
		codes.NotFound:           "`neuron files ls` shows the files there are; a workspace exists once a run with a workspace that lasts used it",
		codes.FailedPrecondition: "is the environment service new enough to keep workspaces (--data-dir/workspaces)?",
	}
	client := environmentv1.NewEnvironmentServiceClient(cc)
	ctx, cancel := context.WithTimeout(ctx, cn.timeout)
	defer cancel()
	switch sub {
	case "ls":
		r, err := client.ListWorkspaceFiles(ctx, &environmentv1.ListWorkspaceFilesRequest{Workspace: ref, Path: pos0(pos)})
		if err != nil {
			return cn.wrap(err)
		}
		if cn.json {
			for _, f := range r.GetFiles() {
				printJSONLine(c.stdout, f)
			}
			return nil
		}
		tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
		for _, f := range r.GetFiles() {
			size, p := fmt.Sprint(f.GetSize()), f.GetPath()
			switch {
			case f.GetDirectory():
				size, p = "-", p+"/"
			case f.GetSymlink():
				size, p = "-", p+" -> "+f.GetTarget()
			}
			fmt.Fprintf(tw, "%04o\t%s\t%s\t%s\n", f.GetMode(), size, f.GetModified().AsTime().Local().Format(time.DateTime), p)
		}
		tw.Flush()
		fmt.Fprintf(c.stdout, "%d entries, %d bytes in files", len(r.GetFiles()), r.GetTotalBytes())
		if r.GetTruncated() {
			fmt.Fprint(c.stdout, " (more not listed)")
		}
		fmt.Fprintln(c.stdout)
		return nil
	case "get":
		st, err := client.ReadWorkspaceFile(ctx, &environmentv1.ReadWorkspaceFileRequest{Workspace: ref, Path: pos[0]})
		if err != nil {
			return cn.wrap(err)
		}
		out, dest := c.stdout, "-"
		if len(pos) == 2 {
			dest = pos[1]
		}
		var f *os.File
		if dest != "-" {
			// Written beside DEST and renamed: DEST is whole or untouched.
			if f, err = os.CreateTemp(filepath.Dir(dest), ".neuron-files-*"); err != nil {
				return &exitError{code: exitFailure, msg: name + ": " + err.Error()}
			}
			defer os.Remove(f.Name())
			defer f.Close()
			out = f
		}
		var n int
		for {
			m, err := st.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return cn.wrap(err)
			}
			if _, err := out.Write(m.GetData()); err != nil {
				return &exitError{code: exitFailure, msg: name + ": " + err.Error()}
			}
			n += len(m.GetData())
		}
		if f != nil {
			if err := f.Close(); err != nil {
				return &exitError{code: exitFailure, msg: name + ": " + err.Error()}
			}
			if err := os.Rename(f.Name(), dest); err != nil {
				return &exitError{code: exitFailure, msg: name + ": " + err.Error()}
			}
			fmt.Fprintf(c.stderr, "%s: %d bytes written to %s\n", pos[0], n, dest)
		}
		return nil
	case "put":
		var in io.Reader = os.Stdin
		if pos[0] != "-" {
			f, err := os.Open(pos[0])
			if err != nil {
				return &exitError{code: exitFailure, msg: name + ": " + err.Error()}
			}
			defer f.Close()
			in = f
		}
		st, err := client.WriteWorkspaceFile(ctx)
		if err != nil {
			return cn.wrap(err)
		}
		hdr := &environmentv1.WorkspaceFileHeader{Workspace: ref, Path: pos[1], Mode: uint32(mode)}
		sendErr := st.Send(&environmentv1.WriteWorkspaceFileRequest{Kind: &environmentv1.WriteWorkspaceFileRequest_Header{Header: hdr}})
		buf := make([]byte, 64<<10)
		for sendErr == nil {
			k, err := in.Read(buf)
			if k > 0 {
				sendErr = st.Send(&environmentv1.WriteWorkspaceFileRequest{Kind: &environmentv1.WriteWorkspaceFileRequest_Data{Data: append([]byte(nil), buf[:k]...)}})
			}
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return &exitError{code: exitFailure, msg: name + ": reading " + pos[0] + ": " + err.Error()}
			}
		}
		// A send fails when the server has already answered: its
		// status comes with CloseAndRecv.
		r, err := st.CloseAndRecv()
		if err != nil {
			return cn.wrap(err)
		}
		if cn.json {
			printJSONLine(c.stdout, r)
			return nil
		}
		fmt.Fprintf(c.stdout, "%s: %d bytes written\n", pos[1], r.GetSize())
		return nil
	case "rm":
		r, err := client.DeleteWorkspace(ctx, &environmentv1.DeleteWorkspaceRequest{Workspace: ref})
		if err != nil {
			return cn.wrap(err)
		}
		if cn.json {
			printJSONLine(c.stdout, r)
		} else if r.GetExisted() {
			fmt.Fprintln(c.stdout, "workspace removed")
		} else {
			fmt.Fprintln(c.stdout, "no such workspace")
		}
		return nil
	}
	return nil
}
