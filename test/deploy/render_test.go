// Package deploy tests what ships besides the code: the kustomize manifests
// under config/ and the clusterctl-style templates under templates/.
package deploy

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"crawl.example.com/proxy-operator/test/envtestutil"
)

// kustomizeBuild renders the kustomization in dir (relative to the
// repository root) exactly as `kustomize build` does. config/certs-selfsigned
// reads files its user generates (hack/webhook-cert.sh): it is rendered from
// an in-memory copy of config/ holding a fresh set (webhookCert).
func kustomizeBuild(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	fsys := filesys.MakeFsOnDisk()
	if dir == selfSignedDir {
		fsys = configWithFiles(t, selfSignedDir, webhookCert(t).files())
	}
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(fsys, filepath.Join(envtestutil.Root(), dir))
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var out []*unstructured.Unstructured
	for _, r := range m.Resources() {
		// Through JSON, so numbers are int64/float64 as unstructured wants.
		b, err := r.MarshalJSON()
		if err != nil {
			t.Fatalf("kustomize build %s: %s: %v", dir, r.CurId(), err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(b); err != nil {
			t.Fatalf("kustomize build %s: %s: %v", dir, r.CurId(), err)
		}
		out = append(out, u)
	}
	return out
}

// configWithFiles is an in-memory copy of the repository's config/ with
// files added to dir (relative to the repository root).
func configWithFiles(t *testing.T, dir string, files map[string][]byte) filesys.FileSystem {
	t.Helper()
	root := envtestutil.Root()
	mem := filesys.MakeFsInMemory()
	err := filepath.WalkDir(filepath.Join(root, "config"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return mem.WriteFile(path, b)
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		if err := mem.WriteFile(filepath.Join(root, dir, name), b); err != nil {
			t.Fatal(err)
		}
	}
	return mem
}

// kustomizationDirs returns every directory under config/ holding a
// kustomization, relative to the repository root.
func kustomizationDirs(t *testing.T) []string {
	t.Helper()
	root := envtestutil.Root()
	var dirs []string
	err := filepath.WalkDir(filepath.Join(root, "config"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch d.Name() {
		case "kustomization.yaml", "kustomization.yml", "Kustomization":
			rel, err := filepath.Rel(root, filepath.Dir(path))
			if err != nil {
				return err
			}
			dirs = append(dirs, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(dirs)
	return dirs
}

// find returns the objects of kind (and name, when not empty).
func find(objs []*unstructured.Unstructured, kind, name string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind && (name == "" || o.GetName() == name) {
			out = append(out, o)
		}
	}
	return out
}

func readFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(envtestutil.Root(), rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
