// Package memlimit derives the manager's soft memory limit (the Go
// runtime's GOMEMLIMIT) from its container's memory limit.
//
// Without a soft limit the runtime lets the heap grow to twice what
// survived the last collection (GOGC=100), so a manager with a large live
// heap can pass its container's limit and be OOM-killed while most of its
// memory is garbage. With one, the collector works harder as the process
// nears it instead. The container's limit is in its cgroup; reading it here
// keeps the two in step wherever the Deployment's limit is changed.
package memlimit

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path"
	"strconv"
	"strings"
)

// Limit is the soft memory limit, in bytes, for a process in the cgroup
// that root (a view of "/": /proc and /sys) describes: ratio of its memory
// limit. ok is false when there is no limit to follow (no cgroup memory
// controller, or "max"). Cgroup v2 and v1 are read, at the process's own
// cgroup path first and then at the mount's root (a container with its own
// cgroup namespace sees its cgroup there).
func Limit(root fs.FS, ratio float64) (limit int64, ok bool, err error) {
	if ratio <= 0 || ratio > 1 {
		return 0, false, fmt.Errorf("memory limit ratio %v: want more than 0 and at most 1", ratio)
	}
	v2, v1 := cgroupPaths(root)
	candidates := []struct{ file, noLimit string }{
		{path.Join("sys/fs/cgroup", v2, "memory.max"), "max"},
		{"sys/fs/cgroup/memory.max", "max"},
		{path.Join("sys/fs/cgroup/memory", v1, "memory.limit_in_bytes"), ""},
		{"sys/fs/cgroup/memory/memory.limit_in_bytes", ""},
	}
	for _, c := range candidates {
		data, err := fs.ReadFile(root, c.file)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, false, err
		}
		s := strings.TrimSpace(string(data))
		if s == c.noLimit {
			return 0, false, nil
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, false, fmt.Errorf("/%s: %q is not a byte count", c.file, s)
		}
		// cgroup v1 says "no limit" with a page-rounded maximum int64.
		if n <= 0 || n >= math.MaxInt64/2 {
			return 0, false, nil
		}
		return int64(float64(n) * ratio), true, nil
	}
	return 0, false, nil
}

// cgroupPaths is the process's cgroup v2 path and its v1 memory
// controller's path, from /proc/self/cgroup ("" when not there).
func cgroupPaths(root fs.FS) (v2, v1 string) {
	data, err := fs.ReadFile(root, "proc/self/cgroup")
	if err != nil {
		return "", ""
	}
	for line := range strings.Lines(string(data)) {
		// hierarchy-ID:controller-list:path
		f := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(f) != 3 {
			continue
		}
		switch {
		case f[0] == "0" && f[1] == "":
			v2 = f[2]
		case strings.Contains(","+f[1]+",", ",memory,"):
			v1 = f[2]
		}
	}
	return v2, v1
}
