package e2eutil

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
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
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// Requests counts image requests; BytesServed the body bytes written.
func (s *ImageServer) Requests() int64    { return s.requests.Load() }
func (s *ImageServer) BytesServed() int64 { return s.served.Load() }

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
