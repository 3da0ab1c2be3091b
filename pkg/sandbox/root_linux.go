package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// newRoot builds the child's private root (Namespaces.Mount) and makes
// it the child's "/": a tmpfs on c.Root, each grant bind-mounted at its
// own path, the Files written, the tmpfs made read-only, pivot_root into
// it and the host's tree detached. It runs in the child's new mount
// namespace, before Landlock and before the identity switch.
func newRoot(c childConfig) error {
	// Nothing done here may propagate back to the host's namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the mount namespace private: %v", err)
	}
	if err := unix.Mount("tmpfs", c.Root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=16m"); err != nil {
		return fmt.Errorf("mounting a tmpfs on %s: %v", c.Root, err)
	}
	// Parents before children, so that a grant inside another one is
	// mounted over the outer one's view of the same host directory.
	grants := append([]grant(nil), c.Grants...)
	sort.SliceStable(grants, func(i, j int) bool { return grants[i].Path < grants[j].Path })
	var bound []string
	for _, g := range grants {
		if isFile(c.Files, g.Path) {
			continue
		}
		ok, err := bindGrant(c.Root, g, bound)
		if err != nil {
			return err
		}
		if ok {
			bound = append(bound, g.Path)
		}
	}
	for _, f := range c.Files {
		dst := filepath.Join(c.Root, f.Path)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(dst, f.Data, 0o400); err != nil {
			return err
		}
		if c.RunAs != nil {
			if err := os.Chown(dst, int(c.RunAs.UID), int(c.RunAs.GID)); err != nil {
				return err
			}
		}
	}
	// The root itself holds only mount points and Files: read-only.
	if err := unix.Mount("", c.Root, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("making the new root read-only: %v", err)
	}
	if err := unix.Chdir(c.Root); err != nil {
		return err
	}
	// pivot_root(".", ".") stacks the old root on the new one; detaching
	// it leaves only the new root, with no path back to the host's.
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %v", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the host's root: %v", err)
	}
	if err := unix.Chdir(c.Dir); err != nil {
		return fmt.Errorf("chdir %s in the new root: %v", c.Dir, err)
	}
	return nil
}

// isFile reports whether path is one of files (a grant made for it).
func isFile(files []File, path string) bool {
	for _, f := range files {
		if filepath.Clean(f.Path) == path {
			return true
		}
	}
	return false
}

// bindGrant bind-mounts the host's g.Path at the same path under root,
// read-only unless g.Write, nosuid, and nodev outside /dev, keeping the
// flags the host's mount already has (a user namespace may not clear
// them). A missing optional grant is skipped (false).
func bindGrant(root string, g grant, bound []string) (bool, error) {
	src := g.Path
	fi, err := os.Stat(src) // follows symlinks, as the bind mount does
	if err != nil {
		if g.Optional && errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		return false, err
	}
	dst := filepath.Join(root, src)
	inside := false
	for _, b := range bound {
		if within(src, b) {
			inside = true
		}
	}
	// Inside an earlier grant the mount point already exists (it is the
	// same host file); creating it would write to the host.
	if !inside {
		if fi.IsDir() {
			err = os.MkdirAll(dst, 0o755)
		} else if err = os.MkdirAll(filepath.Dir(dst), 0o755); err == nil {
			var f *os.File
			if f, err = os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
				err = f.Close()
			}
		}
		if err != nil {
			return false, fmt.Errorf("mount point for %s: %v", src, err)
		}
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return false, fmt.Errorf("bind-mounting %s: %v", src, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(src, &st); err != nil {
		return false, fmt.Errorf("statfs %s: %v", src, err)
	}
	// The ST_* flags statfs reports have the values of the MS_* flags.
	keep := uintptr(st.Flags) & (unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_NOATIME | unix.MS_NODIRATIME | unix.MS_RELATIME)
	flags := unix.MS_REMOUNT | unix.MS_BIND | unix.MS_NOSUID | keep
	if !g.Write {
		flags |= unix.MS_RDONLY
	}
	if !strings.HasPrefix(src, "/dev/") {
		flags |= unix.MS_NODEV
	}
	if err := unix.Mount("", dst, "", flags, ""); err != nil {
		return false, fmt.Errorf("remounting %s: %v", src, err)
	}
	return true, nil
}
