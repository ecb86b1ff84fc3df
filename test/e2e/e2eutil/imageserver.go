package e2eutil

import (
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ImageServer serves one guest image file over HTTP, so the operator's real
// download → sha256 → StorageVolUpload path runs against it.
type ImageServer struct {
	// URL of the image and its Checksum ("sha256:<hex>").
	URL      string
	Checksum string
	Size     int64

	srv      *http.Server
	requests atomic.Int64
	served   atomic.Int64

	path     string
	base     string // URL prefix, http://HOST:PORT
	mu       sync.Mutex
	variants map[string]*Variant
	hashed   []byte // sha256 state after the image's bytes (variants go on from it)
}

// ServeImage serves path at http://HOST:PORT/<file name>, listening on
// listen (e.g. 127.0.0.1:0); advertiseHost replaces the listener's host in
// the URL when set (a listener on 0.0.0.0 reached as the docker gateway).
// The checksum comes from path.sha256 (sha256sum format) when present and is
// computed otherwise.
func ServeImage(path, listen, advertiseHost string) (*ImageServer, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	sum, err := imageChecksum(path)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("image server: %w", err)
	}
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	if advertiseHost != "" {
		host = advertiseHost
	}
	name := filepath.Base(path)
	s := &ImageServer{
		URL:      "http://" + net.JoinHostPort(host, port) + "/" + name,
		Checksum: "sha256:" + sum,
		Size:     st.Size(),
		path:     path,
		base:     "http://" + net.JoinHostPort(host, port),
		variants: map[string]*Variant{},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /"+name, func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		f, err := os.Open(path)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer f.Close()
		cw := &countingWriter{ResponseWriter: w, n: &s.served}
		http.ServeContent(cw, r, name, st.ModTime(), f)
	})
	mux.HandleFunc("GET /variant/{tag}/{kind}/"+name, s.serveVariant)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// Requests counts image requests; BytesServed the body bytes written.
func (s *ImageServer) Requests() int64    { return s.requests.Load() }
func (s *ImageServer) BytesServed() int64 { return s.served.Load() }

// Variant is the image with a tag appended: different bytes, so a different
// sha256 and a volume of its own in the cache, still the same bootable
// qcow2 (nothing in the image refers to bytes past its last cluster). The
// fault tests use variants to make the operator upload again, and to serve
// broken copies of an image whose checksum is right.
type Variant struct {
	// URL serves the variant intact; CorruptURL the same number of bytes
	// with one flipped in the middle, so its sha256 is not Checksum.
	URL        string
	CorruptURL string
	// Checksum ("sha256:<hex>") and Size of the intact variant.
	Checksum string
	Size     int64
	// Volume is the name the operator's image cache gives it in a pool.
	Volume string

	suffix   []byte
	rate     atomic.Int64 // bytes per second; 0: unlimited
	requests atomic.Int64
}

// SetRate limits how fast the variant is served (bytes per second, both
// URLs, effective for writes after the call); 0 lifts the limit.
func (v *Variant) SetRate(bytesPerSecond int64) { v.rate.Store(bytesPerSecond) }

// Requests counts the variant's requests (both URLs).
func (v *Variant) Requests() int64 { return v.requests.Load() }

// Variant returns the variant named tag (a DNS label), made on first use:
// its checksum costs one pass over the image, once per server.
func (s *ImageServer) Variant(tag string) (*Variant, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.variants[tag]; ok {
		return v, nil
	}
	if s.hashed == nil {
		f, err := os.Open(s.path)
		if err != nil {
			return nil, err
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		_ = f.Close()
		if err != nil {
			return nil, err
		}
		if s.hashed, err = h.(encoding.BinaryMarshaler).MarshalBinary(); err != nil {
			return nil, err
		}
	}
	h := sha256.New()
	if err := h.(encoding.BinaryUnmarshaler).UnmarshalBinary(s.hashed); err != nil {
		return nil, err
	}
	suffix := make([]byte, 4096)
	copy(suffix, "\nproxy-operator e2e image variant "+tag+"\n")
	h.Write(suffix)
	digest := hex.EncodeToString(h.Sum(nil))
	name := filepath.Base(s.path)
	v := &Variant{
		URL:        s.base + "/variant/" + tag + "/intact/" + name,
		CorruptURL: s.base + "/variant/" + tag + "/corrupt/" + name,
		Checksum:   "sha256:" + digest,
		Size:       s.Size + int64(len(suffix)),
		Volume:     "image-sha256_" + digest + ".qcow2",
		suffix:     suffix,
	}
	s.variants[tag] = v
	return v, nil
}

func (s *ImageServer) serveVariant(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	v, ok := s.variants[r.PathValue("tag")]
	s.mu.Unlock()
	kind := r.PathValue("kind")
	if !ok || (kind != "intact" && kind != "corrupt") {
		http.NotFound(w, r)
		return
	}
	v.requests.Add(1)
	f, err := os.Open(s.path)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer f.Close()
	body := &variantReader{f: f, base: s.Size, suffix: v.suffix, flipAt: -1}
	if kind == "corrupt" {
		body.flipAt = s.Size / 2
	}
	tw := &throttledWriter{ResponseWriter: &countingWriter{ResponseWriter: w, n: &s.served}, rate: &v.rate, start: time.Now()}
	http.ServeContent(tw, r, filepath.Base(s.path), time.Time{}, body)
}

// variantReader reads the image file, then suffix; the byte at flipAt (if
// >= 0) comes out inverted.
type variantReader struct {
	f      *os.File
	base   int64
	suffix []byte
	flipAt int64
	off    int64
}

func (r *variantReader) Read(p []byte) (int, error) {
	size := r.base + int64(len(r.suffix))
	if r.off >= size {
		return 0, io.EOF
	}
	var n int
	var err error
	if r.off < r.base {
		n, err = r.f.ReadAt(p[:min(int64(len(p)), r.base-r.off)], r.off)
		if errors.Is(err, io.EOF) && n > 0 {
			err = nil
		}
	} else {
		n = copy(p, r.suffix[r.off-r.base:])
	}
	if r.flipAt >= r.off && r.flipAt < r.off+int64(n) {
		p[r.flipAt-r.off] ^= 0xff
	}
	r.off += int64(n)
	return n, err
}

func (r *variantReader) Seek(offset int64, whence int) (int64, error) {
	size := r.base + int64(len(r.suffix))
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += r.off
	case io.SeekEnd:
		offset += size
	}
	if offset < 0 {
		return 0, errors.New("negative offset")
	}
	r.off = offset
	return offset, nil
}

// throttledWriter holds writes back to *rate bytes per second (read at
// each write, so the limit can change during a download).
type throttledWriter struct {
	http.ResponseWriter
	rate  *atomic.Int64
	start time.Time
	sent  int64
}

func (w *throttledWriter) Write(b []byte) (int, error) {
	n, err := w.ResponseWriter.Write(b)
	w.sent += int64(n)
	if rate := w.rate.Load(); rate > 0 {
		due := w.start.Add(time.Duration(float64(w.sent) / float64(rate) * float64(time.Second)))
		if d := time.Until(due); d > 0 {
			time.Sleep(min(d, time.Second))
		}
	} else {
		w.start, w.sent = time.Now(), 0
	}
	return n, err
}

// Close stops the server.
func (s *ImageServer) Close() error { return s.srv.Close() }

type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (w *countingWriter) Write(b []byte) (int, error) {
	n, err := w.ResponseWriter.Write(b)
	w.n.Add(int64(n))
	return n, err
}

// imageChecksum reads path.sha256 ("<hex>  <name>") or hashes the file.
func imageChecksum(path string) (string, error) {
	if b, err := os.ReadFile(path + ".sha256"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 && len(f[0]) == 64 {
			if _, err := hex.DecodeString(f[0]); err == nil {
				return strings.ToLower(f[0]), nil
			}
		}
		return "", fmt.Errorf("%s.sha256: not in sha256sum format", path)
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
