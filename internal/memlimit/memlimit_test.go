package memlimit

import (
	"testing"
	"testing/fstest"
)

func TestLimit(t *testing.T) {
	const mib = 1 << 20
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	for _, tc := range []struct {
		name    string
		files   fstest.MapFS
		ratio   float64
		want    int64
		wantOK  bool
		wantErr bool
	}{
		{name: "v2 namespaced: the mount's root is the container's cgroup", ratio: 0.8, want: 536870912 * 8 / 10, wantOK: true, files: fstest.MapFS{
			"proc/self/cgroup":         file("0::/\n"),
			"sys/fs/cgroup/memory.max": file("536870912\n"),
		}},
		{name: "v2 at the process's own path", ratio: 0.5, want: 128 * mib, wantOK: true, files: fstest.MapFS{
			"proc/self/cgroup":                           file("0::/kubepods/pod1/ctr\n"),
			"sys/fs/cgroup/kubepods/pod1/ctr/memory.max": file("268435456\n"),
		}},
		{name: "v2 without a limit", ratio: 0.8, files: fstest.MapFS{
			"proc/self/cgroup":         file("0::/\n"),
			"sys/fs/cgroup/memory.max": file("max\n"),
		}},
		{name: "v1 at the memory controller's path", ratio: 1, want: 256 * mib, wantOK: true, files: fstest.MapFS{
			"proc/self/cgroup": file("9:name=systemd:/\n4:memory:/process_api/x\n3:cpuset:/\n0::/\n"),
			"sys/fs/cgroup/memory/process_api/x/memory.limit_in_bytes": file("268435456\n"),
		}},
		{name: "v1 namespaced", ratio: 0.8, want: 536870912 * 8 / 10, wantOK: true, files: fstest.MapFS{
			"proc/self/cgroup":                           file("4:cpu,memory:/\n"),
			"sys/fs/cgroup/memory/memory.limit_in_bytes": file("536870912"),
		}},
		{name: "v1 without a limit (page-rounded max int64)", ratio: 0.8, files: fstest.MapFS{
			"proc/self/cgroup":                           file("4:memory:/\n"),
			"sys/fs/cgroup/memory/memory.limit_in_bytes": file("9223372036854771712\n"),
		}},
		{name: "no cgroup files", ratio: 0.8, files: fstest.MapFS{}},
		{name: "garbage in the limit", ratio: 0.8, wantErr: true, files: fstest.MapFS{
			"sys/fs/cgroup/memory.max": file("lots\n"),
		}},
		{name: "ratio above 1", ratio: 1.5, wantErr: true, files: fstest.MapFS{}},
		{name: "ratio 0", ratio: 0, wantErr: true, files: fstest.MapFS{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok, err := Limit(tc.files, tc.ratio)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Limit() error = %v, want error %v", err, tc.wantErr)
			}
			if got != tc.want || ok != tc.wantOK {
				t.Fatalf("Limit() = %d, %v; want %d, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}
