package e2eutil

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ScrapyCrawl runs the shipped Scrapy recipe (docs/examples/scrapy and
// docs/examples/python, with Debian's python3-scrapy) in the pool e2e's
// spider (test/e2e/scrapy/pool_spider.py): it fetches URLs in turn through
// the list at ListPath until Stop.
type ScrapyCrawl struct {
	// Root is the repository's root.
	Root string
	// ListPath is proxies.json in a directory laid out as the kubelet
	// mounts a Secret (ListMirror).
	ListPath string
	// URLs are fetched in turn, a sequence number appended.
	URLs []string
	// Dir receives scrapy.log, the summary and the stop file.
	Dir string
	// Reload is PROXYLIST_RELOAD_INTERVAL, Concurrency CONCURRENT_REQUESTS,
	// Delay DOWNLOAD_DELAY (the crawl's pace: one origin, one slot),
	// Timeout DOWNLOAD_TIMEOUT (default 20 s).
	Reload, Delay, Timeout time.Duration
	Concurrency            int

	cmd    *exec.Cmd
	exited chan struct{}
	err    error
}

// ScrapySummary is what the spider wrote when it closed.
type ScrapySummary struct {
	Reason    string         `json:"reason"`
	Responses int            `json:"responses"`
	Failed    int            `json:"failed"`
	Failures  []string       `json:"failures"`
	Stats     map[string]any `json:"stats"`
}

// Stat is one of Scrapy's counters (0 when absent).
func (s ScrapySummary) Stat(key string) int {
	if f, ok := s.Stats[key].(float64); ok {
		return int(f)
	}
	return 0
}

func (s *ScrapyCrawl) path(name string) string { return filepath.Join(s.Dir, name) }

// Start starts the crawl.
func (s *ScrapyCrawl) Start() error {
	if out, err := exec.Command("/usr/bin/python3", "-c", "import scrapy").CombinedOutput(); err != nil {
		return fmt.Errorf("/usr/bin/python3 cannot import scrapy (apt-get install python3-scrapy; make test-deps does): %w: %s", err, out)
	}
	seconds := func(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) }
	examples := filepath.Join(s.Root, "docs", "examples")
	// Debian's python3 (the one with Scrapy) and nothing from the
	// environment: no http_proxy could carry a request past the recipe.
	cmd := exec.Command("/usr/bin/python3", "-m", "scrapy", "runspider", filepath.Join(s.Root, "test", "e2e", "scrapy", "pool_spider.py"),
		"-a", "urls="+strings.Join(s.URLs, ","), "-a", "stop="+s.path("scrapy.stop"), "-a", "summary="+s.path("scrapy-summary.json"),
		"-s", "PROXYLIST_PATH="+s.ListPath,
		"-s", "PROXYLIST_RELOAD_INTERVAL="+seconds(s.Reload),
		"-s", "CONCURRENT_REQUESTS="+strconv.Itoa(s.Concurrency),
		"-s", "CONCURRENT_REQUESTS_PER_DOMAIN="+strconv.Itoa(s.Concurrency),
		"-s", "DOWNLOAD_DELAY="+seconds(s.Delay),
		// A failure must show, not be retried away by Scrapy; the recipe's
		// own retry through another proxy (a dead one) stays and is counted.
		"-s", "RETRY_ENABLED=0",
		"-s", "DOWNLOAD_TIMEOUT="+seconds(cmp.Or(s.Timeout, 20*time.Second)),
		"-s", "TELNETCONSOLE_ENABLED=0",
		"-s", "LOG_LEVEL=INFO")
	cmd.Dir = s.Dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + s.Dir, "LANG=C.UTF-8", "PYTHONDONTWRITEBYTECODE=1",
		"PYTHONPATH=" + strings.Join([]string{filepath.Join(examples, "python"), filepath.Join(examples, "scrapy")}, ":")}
	log, err := os.Create(s.path("scrapy.log"))
	if err != nil {
		return err
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("scrapy: %w", err)
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	go func() { s.err = cmd.Wait(); close(s.exited) }()
	return nil
}

// Running is nil while the crawl runs, or how it ended.
func (s *ScrapyCrawl) Running() error {
	select {
	case <-s.exited:
		return fmt.Errorf("scrapy ended before it was stopped (%s); see %s", exitOf(s.err), s.path("scrapy.log"))
	default:
		return nil
	}
}

// Stop asks the crawl to end (no new requests; those in flight finish),
// waits up to timeout and returns its summary. It fails when the process
// did not end in time (then it is killed), exited non-zero or wrote no
// summary.
func (s *ScrapyCrawl) Stop(timeout time.Duration) (ScrapySummary, error) {
	var sum ScrapySummary
	if s.cmd == nil {
		return sum, fmt.Errorf("scrapy was not started")
	}
	if err := os.WriteFile(s.path("scrapy.stop"), nil, 0o644); err != nil {
		return sum, err
	}
	select {
	case <-s.exited:
	case <-time.After(timeout):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
		return sum, fmt.Errorf("scrapy still running %s after the stop file; killed (see %s)", timeout, s.path("scrapy.log"))
	}
	b, err := os.ReadFile(s.path("scrapy-summary.json"))
	if err != nil {
		return sum, fmt.Errorf("scrapy (%s) wrote no summary: %w; see %s", exitOf(s.err), err, s.path("scrapy.log"))
	}
	if err := json.Unmarshal(b, &sum); err != nil {
		return sum, fmt.Errorf("scrapy's summary: %w", err)
	}
	if s.err != nil {
		return sum, fmt.Errorf("scrapy exited with %w (reason %s); see %s", s.err, sum.Reason, s.path("scrapy.log"))
	}
	return sum, nil
}

// exitOf describes how the process ended.
func exitOf(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// Kill ends the crawl at once (cleanup after a failure).
func (s *ScrapyCrawl) Kill() {
	if s.cmd == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.exited
}
