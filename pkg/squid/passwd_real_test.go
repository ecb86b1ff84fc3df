package squid

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"crawl.example.com/proxy-operator/pkg/squid/squidtest"
)

// rfc1738Escape encodes like squid does before handing credentials to a
// basic auth helper (every byte but letters and digits).
func rfc1738Escape(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// Debian squid 5.7's basic_ncsa_auth checks hashes with libxcrypt's
// crypt(3): it must accept PasswordFile's bcrypt, under each bcrypt prefix,
// for passwords up to bcrypt's 72 bytes, and refuse everything else.
func TestBasicNCSAAuthAcceptsBcrypt(t *testing.T) {
	squidtest.Binary(t)
	helper := DefaultAuthHelper
	if _, err := os.Stat(helper); err != nil {
		t.Fatalf("%s missing (Debian package squid): %v", helper, err)
	}
	for _, pw := range []string{GeneratePassword(), strings.Repeat("p", MaxPasswordLength), "spaces and ünïcödé + %2F:colon"} {
		a := Auth{Type: AuthBasic, Username: testUser, Password: pw}
		file, err := PasswordFile(a)
		if err != nil {
			t.Fatal(err)
		}
		for _, prefix := range []string{"$2a$", "$2b$", "$2y$"} {
			variant := bytes.Replace(file, []byte(":$2a$"), []byte(":"+prefix), 1)
			path := filepath.Join(t.TempDir(), "passwd")
			if err := os.WriteFile(path, variant, 0o600); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(helper, path)
			cmd.Stdin = strings.NewReader(strings.Join([]string{
				rfc1738Escape(testUser) + " " + rfc1738Escape(pw),
				rfc1738Escape(testUser) + " " + rfc1738Escape(pw[:len(pw)-1]),
				rfc1738Escape(testUser) + " " + rfc1738Escape(pw+"x"),
				rfc1738Escape("crawler") + " " + rfc1738Escape(pw),
			}, "\n") + "\n")
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s: %v", helper, err)
			}
			answers := strings.Split(strings.TrimSpace(string(out)), "\n")
			if len(answers) != 4 || strings.TrimSpace(answers[0]) != "OK" {
				t.Fatalf("%s password %q: correct password not accepted: %q", prefix, pw, out)
			}
			for i, a := range answers[1:] {
				if i == 1 && len(pw) == MaxPasswordLength {
					// bcrypt ignores bytes past 72, so the helper takes
					// pw+"x": why Validate refuses longer passwords.
					if !strings.HasPrefix(a, "OK") {
						t.Errorf("%s: bcrypt no longer truncates at 72 bytes (%q); revisit MaxPasswordLength", prefix, a)
					}
					continue
				}
				if !strings.HasPrefix(a, "ERR") {
					t.Errorf("%s password %q: wrong credential %d accepted: %q", prefix, pw, i+1, a)
				}
			}
		}
	}
}

// BenchmarkBasicNCSAAuthCheck is the CPU squid's helper spends on one
// credential check (a client's first request, each credentialsttl, every
// wrong password), with PasswordFile's hash and, as the baseline in the
// same run, one at Go's bcrypt.DefaultCost (what PasswordFile wrote
// before): the real helper, b.N checks through one process.
func BenchmarkBasicNCSAAuthCheck(b *testing.B) {
	squidtest.Binary(b)
	for _, cost := range []int{PasswordHashCost, bcrypt.DefaultCost} {
		b.Run(fmt.Sprintf("cost=%d", cost), func(b *testing.B) {
			pw := GeneratePassword()
			hash, err := bcrypt.GenerateFromPassword([]byte(pw), cost)
			if err != nil {
				b.Fatal(err)
			}
			path := filepath.Join(b.TempDir(), "passwd")
			if err := os.WriteFile(path, fmt.Appendf(nil, "%s:%s\n", testUser, hash), 0o600); err != nil {
				b.Fatal(err)
			}
			line := []byte(rfc1738Escape(testUser) + " " + rfc1738Escape(pw) + "\n")
			cmd := exec.Command(DefaultAuthHelper, path)
			in, err := cmd.StdinPipe()
			if err != nil {
				b.Fatal(err)
			}
			out, err := cmd.StdoutPipe()
			if err != nil {
				b.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				b.Fatalf("%s: %v", DefaultAuthHelper, err)
			}
			defer func() { _ = in.Close(); _ = cmd.Wait() }()
			answers := bufio.NewReader(out)
			b.ResetTimer()
			for range b.N {
				if _, err := in.Write(line); err != nil {
					b.Fatal(err)
				}
				if a, err := answers.ReadString('\n'); err != nil || !strings.HasPrefix(a, "OK") {
					b.Fatalf("helper answered %q, %v; want OK", a, err)
				}
			}
		})
	}
}
