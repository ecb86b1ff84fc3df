package squidtest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// KubeletDir is a directory laid out as the kubelet writes a mounted
// ConfigMap or Secret (its AtomicWriter): the files live in
// ..<timestamp>/, ..data points there, and each key is a symlink through
// ..data. Write swaps ..data with a rename, so a reader sees the old files
// or the new ones, never a mix.
type KubeletDir struct {
	Dir  string
	gen  int
	last string
}

// NewKubeletDir lays out files in dir (which must exist) with mode.
func NewKubeletDir(t testing.TB, dir string, files map[string][]byte, mode os.FileMode) *KubeletDir {
	t.Helper()
	d := &KubeletDir{Dir: dir}
	d.Write(t, files, mode)
	return d
}

// Write replaces the files, as the kubelet does when the object changes.
func (d *KubeletDir) Write(t testing.TB, files map[string][]byte, mode os.FileMode) {
	t.Helper()
	if err := d.Swap(files, mode); err != nil {
		t.Fatal(err)
	}
}

// Swap is Write for a caller that is no test goroutine (a refresher running
// beside the test): it returns the error instead of failing the test.
func (d *KubeletDir) Swap(files map[string][]byte, mode os.FileMode) error {
	return d.SwapModes(files, func(string) os.FileMode { return mode })
}

// SwapModes is Swap with each key's mode, as a volume's items give it.
func (d *KubeletDir) SwapModes(files map[string][]byte, mode func(key string) os.FileMode) error {
	d.gen++
	ts := fmt.Sprintf("..2026_12_01_10_00_%02d.%06d", d.gen%60, d.gen)
	if err := os.Mkdir(filepath.Join(d.Dir, ts), 0o755); err != nil {
		return err
	}
	for key, data := range files {
		path := filepath.Join(d.Dir, ts, key)
		if err := os.WriteFile(path, data, mode(key)); err != nil {
			return err
		}
		// The umask must not take bits off (an executable key).
		if err := os.Chmod(path, mode(key)); err != nil {
			return err
		}
	}
	tmp := filepath.Join(d.Dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(d.Dir, "..data")); err != nil {
		return err
	}
	for key := range files {
		if _, err := os.Lstat(filepath.Join(d.Dir, key)); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", key), filepath.Join(d.Dir, key)); err != nil {
				return err
			}
		}
	}
	if d.last != "" {
		if err := os.RemoveAll(filepath.Join(d.Dir, d.last)); err != nil {
			return err
		}
	}
	d.last = ts
	return nil
}
