package squid

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"

	"golang.org/x/crypto/bcrypt"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// PasswordFile returns the basic_ncsa_auth file for a Basic Auth: one line
// "username:bcrypt-hash". basic_ncsa_auth checks hashes with crypt(3),
// which on Debian is libxcrypt and accepts bcrypt ($2a$/$2b$/$2y$; the
// tests run the real helper). Never DES crypt, which silently truncates
// passwords to 8 characters. The salt is random, so the output differs on
// every call: use PasswordFileMatches to decide whether to rewrite a file.
func PasswordFile(a Auth) ([]byte, error) {
	if a.Type != AuthBasic {
		return nil, errors.New("auth: a password file is only used with type Basic")
	}
	if err := a.validateBasic(field.NewPath("auth")).ToAggregate(); err != nil {
		return nil, err
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(a.Password), bcrypt.DefaultCost)
	if err != nil {
		return nil, fmt.Errorf("hashing the proxy password: %w", err)
	}
	return fmt.Appendf(nil, "%s:%s\n", a.Username, hash), nil
}

// PasswordFileMatches reports whether file (as PasswordFile wrote it)
// admits exactly a's username and password.
func PasswordFileMatches(file []byte, a Auth) bool {
	user, hash, ok := bytes.Cut(bytes.TrimSuffix(file, []byte("\n")), []byte(":"))
	if !ok || string(user) != a.Username || bytes.ContainsAny(hash, "\n:") {
		return false
	}
	return bcrypt.CompareHashAndPassword(hash, []byte(a.Password)) == nil
}

// GeneratePassword returns a random 32-character password of letters and
// digits (about 190 bits), safe in a proxy URL without escaping.
func GeneratePassword() string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	const length = 32
	out := make([]byte, 0, length)
	buf := make([]byte, 64)
	for len(out) < length {
		rand.Read(buf) // never fails (Go 1.24+)
		for _, c := range buf {
			// 248 = 4*62: rejecting the rest keeps every character equally likely.
			if c < 248 && len(out) < length {
				out = append(out, alphabet[int(c)%len(alphabet)])
			}
		}
	}
	return string(out)
}
