package conn

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// dial opens a new link to h. The caller holds h's slot.
func (p *Pool) dial(ctx context.Context, h *hostState) (*link, error) {
	log := logr.FromContextOrDiscard(ctx).WithValues("host", h.cfg.Name)
	timeout := p.opts.HandshakeTimeout
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("dial timed out after %s", timeout))
	defer cancel()
	stop := context.AfterFunc(h.ctx, cancel) // Remove, Set and Close abort the dial
	defer stop()

	l, err := p.dialStages(ctx, h)
	if err != nil {
		stage, _ := DialStage(err)
		log.V(1).Info("kvm host dial failed", "stage", stage, "error", err.Error())
		return nil, err
	}
	log.Info("connected to kvm host", "address", h.cfg.Address)
	return l, nil
}

func (p *Pool) dialStages(ctx context.Context, h *hostState) (*link, error) {
	cfg := h.cfg
	m, err := h.loadMaterial(ctx)
	if err != nil {
		return nil, materialError(cfg, err)
	}

	tcp, err := p.opts.Dial(ctx, "tcp", cfg.Address)
	if err != nil {
		return nil, transientDialError(StageTCPUnreachable, cfg, withCause(ctx, err))
	}
	// ctx's deadline bounds the SSH handshake and the libvirt connect. It is
	// enforced by closing the TCP connection, the one way to abort a libvirt
	// call in flight (SSH channels have no deadlines), until the link is up.
	stop := context.AfterFunc(ctx, func() { _ = tcp.Close() })

	sshConn, chans, reqs, err := ssh.NewClientConn(tcp, cfg.Address, clientConfig(cfg, m, tcp.RemoteAddr()))
	if err != nil {
		stop()
		_ = tcp.Close()
		return nil, transientDialError(StageSSHHandshakeFailed, cfg, withCause(ctx, err))
	}
	client := ssh.NewClient(sshConn, chans, reqs)

	fail := func(err error) (*link, error) {
		stop()
		_ = client.Close()
		return nil, transientDialError(StageLibvirtConnectFailed, cfg, withCause(ctx, err))
	}
	sock, err := client.Dial("unix", cfg.SocketPath)
	if err != nil {
		return fail(fmt.Errorf("opening %s over ssh: %w", cfg.SocketPath, err))
	}
	lv := p.opts.NewLibvirt(cfg.Name, &connDialer{conn: sock})
	if err := lv.ConnectToURI(libvirt.QEMUSystem); err != nil {
		return fail(err)
	}
	if !stop() { // ctx ended just now and the connection is being closed
		return fail(context.Cause(ctx))
	}
	return &link{ssh: client, lv: lv, done: make(chan struct{})}, nil
}

// withCause names the context's cause when ctx ending made the step fail,
// rather than leaving only the "use of closed network connection" it led to.
func withCause(ctx context.Context, err error) error {
	if ctx.Err() == nil {
		return err
	}
	cause := context.Cause(ctx)
	if errors.Is(err, cause) {
		return err
	}
	return fmt.Errorf("%w (%v)", cause, err) //nolint:errorlint // the cause is what callers classify; err is only the symptom it led to
}

// loadMaterial reads the material afresh for every dial, never from a cache:
// a host key removed from known_hosts (or a revoked client key) must stop
// being trusted at the next dial, not only after a handshake happens to fail.
// Dials are rare (one per link), so the extra Secret read is cheap.
func (h *hostState) loadMaterial(ctx context.Context) (*Material, error) {
	h.mu.Lock()
	load := h.loader
	h.mu.Unlock()
	m, err := load(ctx)
	if err == nil && (m == nil || m.Signer == nil || m.HostKeyCallback == nil) {
		err = provider.Permanentf("ssh material loader returned no signer or no host key callback")
	}
	return m, err
}

func clientConfig(cfg HostConfig, m *Material, remote net.Addr) *ssh.ClientConfig {
	return &ssh.ClientConfig{
		User:              cfg.User,
		Auth:              []ssh.AuthMethod{ssh.PublicKeys(m.Signer)},
		HostKeyCallback:   explainHostKey(m.HostKeyCallback),
		HostKeyAlgorithms: knownHostKeyAlgorithms(m.HostKeyCallback, cfg.Address, remote),
	}
}

// explainHostKey rewords knownhosts' terse errors so a KVMHost condition
// says plainly what is wrong. The *knownhosts.KeyError stays wrapped.
func explainHostKey(cb ssh.HostKeyCallback) ssh.HostKeyCallback {
	return func(addr string, remote net.Addr, key ssh.PublicKey) error {
		err := cb(addr, remote, key)
		if err == nil {
			return nil
		}
		got := key.Type() + " " + ssh.FingerprintSHA256(key)
		var ke *knownhosts.KeyError
		var re *knownhosts.RevokedError
		switch {
		case errors.As(err, &ke) && len(ke.Want) > 0:
			want := make([]string, 0, len(ke.Want))
			for _, k := range ke.Want {
				want = append(want, k.Key.Type()+" "+ssh.FingerprintSHA256(k.Key))
			}
			return fmt.Errorf("host key mismatch for %s: it presented %s but known_hosts has %s (host reinstalled, or a man in the middle): %w",
				knownhosts.Normalize(addr), got, strings.Join(want, ", "), err)
		case errors.As(err, &ke):
			return fmt.Errorf("host key for %s is not in known_hosts (it presented %s; a non-22 port needs a [host]:port entry): %w",
				knownhosts.Normalize(addr), got, err)
		case errors.As(err, &re):
			return fmt.Errorf("host key %s of %s is revoked in known_hosts: %w", got, knownhosts.Normalize(addr), err)
		}
		return fmt.Errorf("host key check for %s: %w", knownhosts.Normalize(addr), err)
	}
}

// probeKey is a key no known_hosts contains; see knownHostKeyAlgorithms.
var probeKey = func() ssh.PublicKey {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		panic(err)
	}
	k, err := ssh.NewPublicKey(pub)
	if err != nil {
		panic(err)
	}
	return k
}()

// knownHostKeyAlgorithms returns the host key algorithms known_hosts has for
// addr, so the server is asked for a key we can verify: x/crypto prefers
// ECDSA, and a host with ECDSA and Ed25519 keys whose known_hosts lists only
// the Ed25519 one would otherwise fail with a mismatch. It asks the
// callback about a key it cannot know; a knownhosts callback answers with
// the keys it wants. Nil (x/crypto's defaults) when it cannot tell.
func knownHostKeyAlgorithms(cb ssh.HostKeyCallback, addr string, remote net.Addr) []string {
	var ke *knownhosts.KeyError
	if err := cb(addr, remote, probeKey); !errors.As(err, &ke) {
		return nil
	}
	var algos []string
	add := func(a ...string) {
		for _, x := range a {
			if !slices.Contains(algos, x) {
				algos = append(algos, x)
			}
		}
	}
	for _, k := range ke.Want {
		if t := k.Key.Type(); t == ssh.KeyAlgoRSA {
			add(ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA)
		} else {
			add(t)
		}
	}
	return algos
}

// connDialer hands go-libvirt the already-open forwarded socket. A link is
// never reconnected in place (the pool dials a new one), so it dials once.
type connDialer struct {
	conn net.Conn
	used atomic.Bool
}

func (d *connDialer) Dial() (net.Conn, error) {
	if d.used.Swap(true) {
		return nil, errors.New("libvirt socket already used; the pool dials a new link instead")
	}
	return d.conn, nil
}
