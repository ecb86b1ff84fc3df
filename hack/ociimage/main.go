// Command ociimage assembles a container image from local files, with no
// registry and no daemon, and writes it as an OCI image layout archive that
// `ctr images import` loads: the test node's images (the manager, pause,
// squid) are built this way because nothing can be pulled where the tests
// run (test/e2e/cluster).
//
//	ociimage -o OUT.tar -name REF [-file SRC:DST:MODE]... [-dir DST:MODE]...
//	         [-layer-tar FILE]... [-entrypoint ARG]... [-cmd ARG]...
//	         [-user UID:GID] [-env K=V]... [-workdir DIR]
//
// -file and -dir entries form one layer, owned by root, with the modes
// given and a zero timestamp, so the same inputs give the same digest.
// -layer-tar adds a ready tar (a root filesystem from mmdebstrap) as a
// layer of its own, before that one. The image's manifest digest is printed
// on stdout; the archive names the image REF and REPO@DIGEST.
// It lives in a module of its own, so the operator's go.mod does not carry
// go-containerregistry.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var (
		out, name, user, workdir            string
		files, dirs, tars, entry, cmd, envs list
	)
	flag.StringVar(&out, "o", "", "output: OCI image layout archive (tar)")
	flag.StringVar(&name, "name", "", "image reference, e.g. docker.io/library/proxy-operator:dev")
	flag.Var(&files, "file", "SRC:DST:MODE (octal), a file of the top layer")
	flag.Var(&dirs, "dir", "DST:MODE (octal), a directory of the top layer")
	flag.Var(&tars, "layer-tar", "a tar file added as a layer (below the -file/-dir layer)")
	flag.Var(&entry, "entrypoint", "entrypoint argument (repeat)")
	flag.Var(&cmd, "cmd", "cmd argument (repeat)")
	flag.Var(&envs, "env", "K=V (repeat)")
	flag.StringVar(&user, "user", "", "UID:GID the image runs as")
	flag.StringVar(&workdir, "workdir", "", "working directory")
	flag.Parse()
	if err := run(out, name, user, workdir, files, dirs, tars, entry, cmd, envs); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

func run(out, name, user, workdir string, files, dirs, tars, entry, cmd, envs []string) error {
	if out == "" || name == "" {
		return errors.New("-o and -name are required")
	}
	if i := strings.LastIndex(name, ":"); i < 0 || i < strings.LastIndex(name, "/") {
		return fmt.Errorf("-name %q: want REPOSITORY:TAG", name)
	}
	if len(files)+len(dirs)+len(tars) == 0 {
		return errors.New("no content: give -file, -dir or -layer-tar")
	}
	var layers []v1.Layer
	for _, t := range tars {
		l, err := tarball.LayerFromFile(t, tarball.WithCompressionLevel(gzip.BestSpeed))
		if err != nil {
			return fmt.Errorf("-layer-tar %s: %w", t, err)
		}
		layers = append(layers, l)
	}
	if len(files)+len(dirs) > 0 {
		b, err := filesLayer(files, dirs)
		if err != nil {
			return err
		}
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(b)), nil
		}, tarball.WithCompressionLevel(gzip.BestSpeed))
		if err != nil {
			return err
		}
		layers = append(layers, l)
	}
	// OCI media types throughout: containerd imports the index as it is,
	// so the digest printed here is the one the runtime knows.
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layers...)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cf.Config = v1.Config{Entrypoint: entry, Cmd: cmd, Env: envs, User: user, WorkingDir: workdir}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}

	dir, err := os.MkdirTemp(filepath.Dir(out), ".ociimage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	// containerd names an imported image after io.containerd.image.name
	// (the OCI ref name is the tag, as the layout spec has it). The image
	// is listed twice, by tag and by digest, as a pull by digest would
	// name it: a pod can then pin it as REPO@DIGEST.
	repo, tag := name[:strings.LastIndex(name, ":")], name[strings.LastIndex(name, ":")+1:]
	for _, ann := range []map[string]string{
		{"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag},
		{"io.containerd.image.name": repo + "@" + digest.String()},
	} {
		if err := p.AppendImage(img, layout.WithAnnotations(ann),
			layout.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH})); err != nil {
			return err
		}
	}
	if err := tarDir(dir, out); err != nil {
		return err
	}
	fmt.Println(digest.String())
	return nil
}

// filesLayer is a tar of the -dir and -file entries (parents included),
// root-owned with a zero mtime.
func filesLayer(files, dirs []string) ([]byte, error) {
	type entry struct {
		src  string
		mode int64
		dir  bool
	}
	entries := map[string]entry{}
	addParents := func(p string) {
		for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
			if _, ok := entries[d]; !ok {
				entries[d] = entry{mode: 0o755, dir: true}
			}
		}
	}
	for _, d := range dirs {
		dst, mode, ok := strings.Cut(d, ":")
		m, err := strconv.ParseInt(mode, 8, 64)
		if !ok || err != nil || !path.IsAbs(dst) {
			return nil, fmt.Errorf("-dir %q: want /DST:OCTALMODE", d)
		}
		entries[path.Clean(dst)] = entry{mode: m, dir: true}
		addParents(path.Clean(dst))
	}
	for _, f := range files {
		parts := strings.Split(f, ":")
		if len(parts) != 3 || !path.IsAbs(parts[1]) {
			return nil, fmt.Errorf("-file %q: want SRC:/DST:OCTALMODE", f)
		}
		m, err := strconv.ParseInt(parts[2], 8, 64)
		if err != nil {
			return nil, fmt.Errorf("-file %q: mode: %w", f, err)
		}
		entries[path.Clean(parts[1])] = entry{src: parts[0], mode: m}
		addParents(path.Clean(parts[1]))
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names) // parents before children
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := entries[n]
		h := &tar.Header{Name: strings.TrimPrefix(n, "/"), Mode: e.mode, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		if e.dir {
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
			if err := tw.WriteHeader(h); err != nil {
				return nil, err
			}
			continue
		}
		b, err := os.ReadFile(e.src)
		if err != nil {
			return nil, err
		}
		h.Typeflag, h.Size = tar.TypeReg, int64(len(b))
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarDir writes the layout directory as the archive ctr imports.
func tarDir(dir, out string) error {
	f, err := os.Create(out + ".tmp")
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	err = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name, h.Uid, h.Gid, h.Uname, h.Gname, h.Mode = filepath.ToSlash(rel), 0, 0, "", "", 0o644
		if fi.IsDir() {
			h.Name, h.Mode = h.Name+"/", 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		r, err := os.Open(p)
		if err != nil {
			return err
		}
		defer r.Close()
		_, err = io.Copy(tw, r)
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(out + ".tmp")
		return err
	}
	return os.Rename(out+".tmp", out)
}
