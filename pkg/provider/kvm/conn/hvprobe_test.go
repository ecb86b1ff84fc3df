//go:build hvprobe

package conn_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/conn"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/image"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
)

// TestUploadProbe is a measuring tool, not a test: on the e2e's test
// hypervisor (real sshd, real libvirtd; test/e2e/infra) it uploads one image
// file by several paths, interleaved, and logs MB/s per path. It is how the
// cause of issue 17's slow upload was found (docs/performance.md §1): the
// size of the libvirt stream messages, which no in-process fake shows.
//
//	cache            image.Cache.Ensure from a local HTTP server, the
//	                 operator's upload as it is built
//	http-whole-read  the cache's reader before the fix: one HTTP body read
//	                 (up to go-libvirt's 4 MiB buffer) per stream message
//	http-sync-N      HTTP body + sha256, N bytes per stream message
//	http-pump-N      the same, read ahead and hashed in a goroutine of its
//	                 own (4-8 buffers of N)
//	file-N           a local file, N bytes per stream message, no hashing
//	ssh-gcm          OpenSSH: ssh -c aes128-gcm@openssh.com host 'cat > pool/x'
//
// Run as root with a hypervisor up (PROBE_FILE: an image file, e.g. the
// e2e's guest image in ~/.cache/proxy-operator/e2e-images/):
//
//	test/e2e/infra/hypervisor.sh up /tmp/hv
//	eval "$(test/e2e/infra/hypervisor.sh env /tmp/hv)"
//	go test -c -tags hvprobe -o /tmp/hvprobe.test ./pkg/provider/kvm/conn/
//	ip netns exec $KVM_TEST_NETNS env PROBE_FILE=... /tmp/hvprobe.test -test.run UploadProbe -test.v
//	# go-libvirt straight on libvirtd's unix socket, no SSH:
//	test/e2e/infra/hypervisor.sh exec /tmp/hv -- env PROBE_UNIX=1 PROBE_PATHS=file-256K,file-1M,file-4M \
//	    KVM_TEST_POOL=$KVM_TEST_POOL KVM_TEST_SOCKET=$KVM_TEST_SOCKET PROBE_FILE=... /tmp/hvprobe.test -test.run UploadProbe -test.v
//	test/e2e/infra/hypervisor.sh down /tmp/hv
//
// PROBE_PATHS (comma-separated names) picks paths, PROBE_ROUNDS (default 3)
// the rounds. "busy" is the machine's CPU use during the transfer, in
// cores×100 (200% = both cores of this machine).
func TestUploadProbe(t *testing.T) {
	file := os.Getenv("PROBE_FILE")
	st, err := os.Stat(file)
	if err != nil {
		t.Fatalf("PROBE_FILE: %v", err)
	}
	size := st.Size()
	sum := fileSHA256(t, file)
	poolName := os.Getenv("KVM_TEST_POOL")

	var do func(func(virt.Client) error) error
	if os.Getenv("PROBE_UNIX") != "" {
		uc, err := net.Dial("unix", os.Getenv("KVM_TEST_SOCKET"))
		if err != nil {
			t.Fatal(err)
		}
		direct := libvirt.NewWithDialer(dialers.NewAlreadyConnected(uc))
		if err := direct.ConnectToURI(libvirt.QEMUSystem); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = direct.Disconnect() }()
		do = func(f func(virt.Client) error) error { return f(direct) }
	} else {
		pool := sshPool(t)
		defer pool.Close()
		do = func(f func(virt.Client) error) error { return pool.Do(context.Background(), "hv", f) }
	}

	// Like the e2e's image server: 32 KiB writes, no sendfile.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, err := os.Open(file)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer f.Close()
		http.ServeContent(struct{ http.ResponseWriter }{w}, r, "img", time.Time{}, f)
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	url := "http://" + ln.Addr().String() + "/img"

	upload := func(open func() (io.Reader, func() error)) func() error {
		return func() error {
			return do(func(c virt.Client) error {
				p, err := c.StoragePoolLookupByName(poolName)
				if err != nil {
					return err
				}
				if v, err := c.StorageVolLookupByName(p, "probe.raw"); err == nil {
					_ = c.StorageVolDelete(v, 0)
				}
				v, err := c.StorageVolCreateXML(p, "<volume><name>probe.raw</name><capacity>0</capacity><target><format type='raw'/></target></volume>", 0)
				if err != nil {
					return err
				}
				r, done := open()
				err = c.StorageVolUpload(v, r, 0, uint64(size), 0)
				if derr := done(); err == nil {
					err = derr
				}
				return err
			})
		}
	}
	// fromHTTP opens the image over HTTP as the cache does (a 64 KiB
	// bufio.Reader on the body) and hashes what wrap's reader passes on.
	fromHTTP := func(wrap func(r io.Reader, h hash.Hash) io.Reader) func() (io.Reader, func() error) {
		return func() (io.Reader, func() error) {
			resp, err := http.Get(url)
			if err != nil {
				t.Fatal(err)
			}
			h := sha256.New()
			return wrap(bufio.NewReaderSize(resp.Body, 64<<10), h), func() error {
				resp.Body.Close()
				if got := hex.EncodeToString(h.Sum(nil)); got != sum {
					return fmt.Errorf("sha256 %s, want %s", got, sum)
				}
				return nil
			}
		}
	}
	fromFile := func(chunk int) func() (io.Reader, func() error) {
		return func() (io.Reader, func() error) {
			f, err := os.Open(file)
			if err != nil {
				t.Fatal(err)
			}
			return fullChunks{f, chunk}, f.Close
		}
	}
	type path struct {
		name string
		run  func() error
	}
	paths := []path{
		{"cache", func() error {
			return do(func(c virt.Client) error {
				p, err := c.StoragePoolLookupByName(poolName)
				if err != nil {
					return err
				}
				// Every round uploads anew: the volume, its marker and claim go.
				vols, _, err := c.StoragePoolListAllVolumes(p, 1, 0)
				if err != nil {
					return err
				}
				for _, v := range vols {
					if strings.HasPrefix(v.Name, "image-") {
						if err := c.StorageVolDelete(v, 0); err != nil {
							return err
						}
					}
				}
				var cache image.Cache
				res, err := cache.Ensure(context.Background(), c, p, provider.Image{Name: "probe", URL: url, Checksum: "sha256:" + sum, Format: image.FormatQCOW2}, nil)
				if err == nil && res.Bytes != size {
					err = fmt.Errorf("uploaded %d of %d bytes", res.Bytes, size)
				}
				return err
			})
		}},
		{"http-whole-read", upload(fromHTTP(func(r io.Reader, h hash.Hash) io.Reader { return io.TeeReader(r, h) }))},
	}
	for _, k := range []int{64, 256, 1024, 2048} {
		paths = append(paths, path{fmt.Sprintf("http-sync-%s", kib(k)), upload(fromHTTP(func(r io.Reader, h hash.Hash) io.Reader {
			return io.TeeReader(fullChunks{r, k << 10}, h)
		}))})
	}
	for _, k := range []int{256, 1024} {
		paths = append(paths, path{fmt.Sprintf("http-pump-%s", kib(k)), upload(fromHTTP(func(r io.Reader, h hash.Hash) io.Reader {
			return newPump(r, h, k<<10, max(4, 2048/k))
		}))})
	}
	for _, k := range []int{256, 1024, 4096} {
		// 4M is go-libvirt's largest message: its 4 MiB buffer less the header.
		paths = append(paths, path{fmt.Sprintf("file-%s", kib(k)), upload(fromFile(k<<10 - 28))})
	}
	paths = append(paths, path{"ssh-gcm", func() error { return sshCat(file) }})

	if only := os.Getenv("PROBE_PATHS"); only != "" {
		names := strings.Split(only, ",")
		paths = slices.DeleteFunc(paths, func(p path) bool { return !slices.Contains(names, p.name) })
	}
	rounds, _ := strconv.Atoi(os.Getenv("PROBE_ROUNDS"))
	if rounds <= 0 {
		rounds = 3
	}
	for _, p := range paths { // warm up: dial, page cache
		if err := p.run(); err != nil {
			t.Fatalf("%s: %v", p.name, err)
		}
	}
	mbs := map[string][]float64{}
	notes := map[string][]string{}
	for i := range rounds {
		for k := range paths {
			p := paths[(i+k)%len(paths)]
			b0, t0 := cpuJiffies()
			start := time.Now()
			if err := p.run(); err != nil {
				t.Fatalf("%s: %v", p.name, err)
			}
			d := time.Since(start)
			b1, t1 := cpuJiffies()
			mb := float64(size) / d.Seconds() / 1e6
			mbs[p.name] = append(mbs[p.name], mb)
			notes[p.name] = append(notes[p.name], fmt.Sprintf("%.1f (busy %.0f%%)", mb, 200*float64(b1-b0)/float64(max(t1-t0, 1))))
		}
	}
	for _, p := range paths {
		v := slices.Clone(mbs[p.name])
		slices.Sort(v)
		t.Logf("%-16s median %6.1f MB/s   rounds: %s", p.name, v[len(v)/2], strings.Join(notes[p.name], ", "))
	}
}

func kib(k int) string {
	if k >= 1024 {
		return strconv.Itoa(k>>10) + "M"
	}
	return strconv.Itoa(k) + "K"
}

// sshPool dials the hypervisor's sshd as the suite does inside its network
// namespace (127.0.0.1:22), trusting the host key hypervisor.sh wrote for
// its loopback forward.
func sshPool(t *testing.T) *conn.Pool {
	t.Helper()
	keyPEM, err := os.ReadFile(os.Getenv("KVM_TEST_KEY"))
	if err != nil {
		t.Fatal(err)
	}
	kh, err := os.ReadFile(os.Getenv("KVM_TEST_KNOWN_HOSTS"))
	if err != nil {
		t.Fatal(err)
	}
	kh = regexp.MustCompile(`(?m)^\[127\.0\.0\.1\]:\d+ `).ReplaceAll(kh, []byte("127.0.0.1 "))
	m, err := conn.ParseMaterial(keyPEM, kh)
	if err != nil {
		t.Fatal(err)
	}
	pool := conn.New(conn.Options{})
	if err := pool.Set(conn.HostConfig{Name: "hv", Address: "127.0.0.1:22", User: os.Getenv("KVM_TEST_USER"), SocketPath: os.Getenv("KVM_TEST_SOCKET")},
		func(context.Context) (*conn.Material, error) { return m, nil }); err != nil {
		t.Fatal(err)
	}
	return pool
}

// sshCat is the e2e's OpenSSH baseline (e2eutil.SSHCat) with aes128-gcm.
func sshCat(file string) error {
	kh, err := os.ReadFile(os.Getenv("KVM_TEST_KNOWN_HOSTS"))
	if err != nil {
		return err
	}
	f, err := os.CreateTemp("", "probe-known_hosts-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	_, _ = f.Write(regexp.MustCompile(`(?m)^\[127\.0\.0\.1\]:\d+ `).ReplaceAll(kh, []byte("127.0.0.1 ")))
	_ = f.Close()
	in, err := os.Open(file)
	if err != nil {
		return err
	}
	defer in.Close()
	cmd := exec.Command("ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile="+f.Name(),
		"-i", os.Getenv("KVM_TEST_KEY"), "-p", "22", "-c", "aes128-gcm@openssh.com",
		os.Getenv("KVM_TEST_USER")+"@127.0.0.1", "cat > "+os.Getenv("KVM_TEST_POOL_PATH")+"/x")
	cmd.Stdin = in
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%w: %s", err, out)
	}
	return nil
}

func fileSHA256(t *testing.T, file string) string {
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// cpuJiffies returns the machine's busy and total CPU time from /proc/stat.
func cpuJiffies() (busy, total int64) {
	b, _ := os.ReadFile("/proc/stat")
	line, _, _ := strings.Cut(string(b), "\n")
	for i, s := range strings.Fields(line)[1:] {
		v, _ := strconv.ParseInt(s, 10, 64)
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total
}

// fullChunks reads up to n bytes per Read, as many reads of r as that takes.
type fullChunks struct {
	r io.Reader
	n int
}

func (c fullChunks) Read(p []byte) (int, error) {
	n, err := io.ReadFull(c.r, p[:min(len(p), c.n)])
	if err == io.ErrUnexpectedEOF {
		err = nil // the short last chunk; EOF comes next
	}
	return n, err
}

// pump reads r ahead in a goroutine of its own, into buffers of chunk
// bytes, hashing as it goes; Read hands out one buffer's worth at most.
type pump struct {
	full, free chan []byte
	errc       chan error
	buf, rest  []byte
}

func newPump(r io.Reader, h hash.Hash, chunk, buffers int) *pump {
	p := &pump{full: make(chan []byte, buffers), free: make(chan []byte, buffers+1), errc: make(chan error, 1)}
	for range buffers + 1 {
		p.free <- make([]byte, chunk)
	}
	go func() {
		defer close(p.full)
		for b := range p.free {
			n, err := io.ReadFull(r, b)
			h.Write(b[:n])
			if n > 0 {
				p.full <- b[:n]
			}
			if err != nil {
				if err == io.ErrUnexpectedEOF {
					err = io.EOF
				}
				p.errc <- err
				return
			}
		}
	}()
	return p
}

func (p *pump) Read(out []byte) (int, error) {
	if len(p.rest) == 0 {
		if p.buf != nil {
			p.free <- p.buf[:cap(p.buf)]
		}
		b, ok := <-p.full
		if !ok {
			return 0, <-p.errc
		}
		p.buf, p.rest = b, b
	}
	n := copy(out, p.rest)
	p.rest = p.rest[n:]
	return n, nil
}
