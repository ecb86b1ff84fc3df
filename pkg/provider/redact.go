package provider

import "net/url"

// RedactURL returns raw fit for logs, status conditions and events: no user
// information at all (a token is often the user name, not only the
// password), no query (for pre-signed object storage URLs a credential) and
// no fragment. Every provider error or log line naming a URL goes through it.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<unparsable URL>"
	}
	if u.User != nil {
		u.User = url.User("redacted")
	}
	if u.RawQuery != "" {
		u.RawQuery = "redacted"
	}
	u.Fragment, u.RawFragment = "", ""
	return u.String()
}
