package squid

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"

	"golang.org/x/crypto/bcrypt"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// PasswordFile returns the basic_ncsa_auth file for users (each of type
// Basic): one line "username:bcrypt-hash" each. basic_ncsa_auth checks
// hashes with crypt(3), which on Debian is libxcrypt and accepts bcrypt
// ($2a$/$2b$/$2y$; the tests run the real helper). Never DES crypt, which
// silently truncates passwords to 8 characters. The salt is random, so the
// output differs on every call: use PasswordFileMatches to decide whether
// to rewrite a file. A Config's users are PasswordUsers.
func PasswordFile(users ...Auth) ([]byte, error) {
	if len(users) == 0 {
		return nil, errors.New("auth: a password file needs a user of type Basic")
	}
	var out []byte
	seen := map[string]bool{}
	for _, a := range users {
		if a.Type != AuthBasic {
			return nil, errors.New("auth: a password file is only used with type Basic")
		}
		if err := a.validateBasic(field.NewPath("auth")).ToAggregate(); err != nil {
			return nil, err
		}
		if seen[a.Username] {
			return nil, fmt.Errorf("auth: user %q twice in one password file", a.Username)
		}
		seen[a.Username] = true
		hash, err := bcrypt.GenerateFromPassword([]byte(a.Password), PasswordHashCost)
		if err != nil {
			return nil, fmt.Errorf("hashing the proxy password: %w", err)
		}
		out = fmt.Appendf(out, "%s:%s\n", a.Username, hash)
	}
	return out, nil
}

// PasswordHashCost is the bcrypt cost of PasswordFile's hashes: 5, what
// htpasswd -B writes by default. squid's helper checks a credential at
// its first request, again at each credentialsttl, and for every wrong
// password sent, so the cost is paid on the serving path: Go's
// bcrypt.DefaultCost (10) took 60 ms a check natively and over a second
// in a TCG guest, where it was most of the first answer's latency. The
// hash guards only a leaked password file against offline guessing, and
// every password is at least MinPasswordLength characters (generated
// ones 32 random, about 190 bits), against which 32 times fewer rounds
// change nothing practical.
const PasswordHashCost = 5

// PasswordUsers are the users c's password file holds: the clients' Basic
// credential and the operator's Stats one, when set; none means squid needs
// no password file.
func (c Config) PasswordUsers() []Auth {
	var users []Auth
	for _, a := range []Auth{c.Auth, c.Stats} {
		if a.Type == AuthBasic {
			users = append(users, a)
		}
	}
	return users
}

// PasswordFileMatches reports whether file (as PasswordFile wrote it)
// admits exactly users, with their passwords, in that order.
func PasswordFileMatches(file []byte, users ...Auth) bool {
	lines := bytes.Split(bytes.TrimSuffix(file, []byte("\n")), []byte("\n"))
	if len(users) == 0 || len(lines) != len(users) {
		return false
	}
	for i, a := range users {
		user, hash, ok := bytes.Cut(lines[i], []byte(":"))
		if !ok || string(user) != a.Username || bytes.ContainsAny(hash, ":") {
			return false
		}
		if bcrypt.CompareHashAndPassword(hash, []byte(a.Password)) != nil {
			return false
		}
	}
	return true
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
