// Package squid renders the operator-managed squid.conf and the
// basic_ncsa_auth password file of one Proxy, for every provider.
//
// Render is pure (no I/O): a provider decides where the files go (the
// Paths of its Config) and how they reach squid. The access policy and why
// each rule is there is described in docs/security.md ("The rendered
// squid.conf"); Render's comments say what squid would do otherwise.
package squid

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"unicode"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Defaults applied by Render to zero fields.
const (
	DefaultPort                    = 3128
	DefaultMaxConnectionsPerClient = 256
	DefaultPasswordFile            = "/etc/squid/passwd"
	DefaultAuthHelper              = "/usr/lib/squid/basic_ncsa_auth"
	// DefaultAccessLog is squid's built-in access log (Debian's build).
	DefaultAccessLog = "/var/log/squid/access.log"
)

// DefaultAllowedPorts are the destination ports when AllowedPorts is empty.
var DefaultAllowedPorts = []int{80, 443}

// ConnectPort is the only port CONNECT may tunnel to (and only when it is
// also in AllowedPorts): a CONNECT tunnel carries any protocol, so allowing
// it elsewhere turns the proxy into a generic TCP relay (SMTP, SSH, ...).
const ConnectPort = 443

// Password limits: bcrypt uses the first 72 bytes only (and Go's bcrypt
// refuses longer input rather than truncating silently); 16 keeps users
// from supplying a guessable one. GeneratePassword's are 32 characters.
const (
	MinPasswordLength = 16
	MaxPasswordLength = 72
)

// Auth types. There is no zero default: None must be chosen explicitly.
type AuthType string

const (
	AuthBasic AuthType = "Basic"
	AuthNone  AuthType = "None"
)

// With auth None the source list is the only guard, so each entry must be
// a single subnet at most (no /8 "our whole network", no 0.0.0.0/0).
const (
	noAuthMinBitsV4 = 24
	noAuthMinBitsV6 = 64
)

// Auth is how clients authenticate. Username and Password are used only for
// Basic; the password never appears in squid.conf, only hashed in the
// password file.
type Auth struct {
	Type     AuthType
	Username string
	Password string
}

// Paths are where the provider puts squid's files. Empty means the default
// (PasswordFile, AuthHelper) or squid's built-in value (the others).
type Paths struct {
	PasswordFile string
	AuthHelper   string
	PidFile      string
	CacheLog     string
	// AccessLog is a file written by squid's stdio module, or "none".
	AccessLog   string
	CoredumpDir string
	// DeniedDestinationsFile is a file of more destinations to refuse
	// (DeniedDestinationsFile writes it), read by squid at start and on
	// every reconfigure: a provider keeps it current without rendering
	// squid.conf again (the kubernetes provider's cluster ranges). No
	// exception lifts what it lists. Empty: no such file.
	DeniedDestinationsFile string
	// UpstreamCounter is where the provider put UpstreamCounter,
	// executable by squid's user. Set, with a Stats credential, squid.conf
	// runs it as its logfile daemon to count the target sites' answers by
	// class (UpstreamURL). Empty: they are not counted.
	UpstreamCounter string
}

// Config is what spec.access carries, plus the provider's paths.
type Config struct {
	// ListenAddress is an IP address to bind; empty binds every address.
	ListenAddress string
	// Port is the proxy port; 0 means DefaultPort.
	Port int
	// AllowedSourceCIDRs are the client ranges admitted (as squid sees the
	// source, i.e. after NAT). Required.
	AllowedSourceCIDRs []string
	Auth               Auth
	// Stats is the operator's own credential for squid's traffic counters
	// (StatsActions, asked for through the proxy port; see StatsURL). It
	// admits nothing else, and no other credential reads them: crawlers
	// never hold it. Zero Type: nobody reads the counters.
	Stats Auth
	// UpstreamCountsPort is the loopback port of Paths.UpstreamCounter;
	// 0 means UpstreamCountsPort(Port).
	UpstreamCountsPort int
	// AllowedPorts are the destination ports; empty means 80 and 443.
	// CONNECT goes only to ConnectPort, and only when it is listed here.
	AllowedPorts []int
	// ExtraDeniedDestinations are refused on top of the default list (pod
	// and service CIDRs, hypervisor management networks, ...).
	ExtraDeniedDestinations []string
	// AllowedDestinationExceptions are carved out of the default denied
	// destinations and nothing else: each must lie inside one of them and
	// must not overlap ExtraDeniedDestinations.
	AllowedDestinationExceptions []string
	// MaxConnectionsPerClient caps concurrent connections per client
	// address; 0 means DefaultMaxConnectionsPerClient.
	MaxConnectionsPerClient int
	Paths                   Paths
	// BroadSourcesWithoutAuth lifts the limit on source ranges with auth
	// None (/24, IPv6 /64). Only for a provider's built-in policy where the
	// network itself bounds who can connect: the kubernetes provider's
	// unmanaged proxies, which admit the cluster's private ranges and are
	// reachable only inside the cluster. spec.access never sets it.
	BroadSourcesWithoutAuth bool
}

var (
	usernamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	// squid reads IPv4-mapped IPv6 entries as IPv4, and an IPv6 range that
	// covers them overlaps every IPv4 entry of the ACL, whereupon squid
	// drops one of the two (measured with squid 5.7). Only plain IPv4 form.
	v4MappedRange = netip.MustParsePrefix("::ffff:0:0/96")
)

// Validate returns every problem of c, each naming its field like
// spec.access does. Render validates too; call this for admission.
func (c Config) Validate() error {
	return c.ValidateFields(nil).ToAggregate()
}

// ValidateFields is Validate with the field paths under fldPath (nil for
// the bare names), for a webhook that validates spec.access.
func (c Config) ValidateFields(fldPath *field.Path) field.ErrorList {
	errs := c.validateListener(fldPath)

	sources, srcErrs := parseSources(fldPath.Child("allowedSourceCIDRs"), c.AllowedSourceCIDRs)
	errs = append(errs, srcErrs...)
	errs = append(errs, c.validateAuth(fldPath, sources)...)
	errs = append(errs, c.validateStats(fldPath.Child("stats"))...)

	for i, p := range c.AllowedPorts {
		if p < 1 || p > 65535 {
			errs = append(errs, field.Invalid(fldPath.Child("allowedPorts").Index(i), p, "must be between 1 and 65535"))
		}
	}
	errs = append(errs, c.validateDestinations(fldPath)...)

	if c.MaxConnectionsPerClient < 0 {
		errs = append(errs, field.Invalid(fldPath.Child("maxConnectionsPerClient"), c.MaxConnectionsPerClient, fmt.Sprintf("must be positive (0 selects %d)", DefaultMaxConnectionsPerClient)))
	}
	return append(errs, c.validatePaths(fldPath.Child("paths"))...)
}

// ValidateSources checks client ranges (at path) as AllowedSourceCIDRs
// must be: at least one, each a CIDR squid and a NetworkPolicy read alike.
// For a provider that admits an unmanaged Proxy's clients by them
// itself.
func ValidateSources(path *field.Path, cidrs []string) field.ErrorList {
	_, errs := parseSources(path, cidrs)
	return errs
}

// parseSources is ValidateSources, returning the parsed ranges.
func parseSources(path *field.Path, cidrs []string) ([]netip.Prefix, field.ErrorList) {
	var errs field.ErrorList
	if len(cidrs) == 0 {
		errs = append(errs, field.Required(path, "list the client ranges that may use the proxy; an empty list would make it unusable or, worse, open"))
	}
	sources, parseErrs := parsePrefixes(path, cidrs)
	return sources, append(errs, parseErrs...)
}

// validateListener checks where squid listens.
func (c Config) validateListener(fldPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	if c.ListenAddress != "" {
		a, err := netip.ParseAddr(c.ListenAddress)
		if err != nil || a.Zone() != "" || a.Is4In6() {
			errs = append(errs, field.Invalid(fldPath.Child("listenAddress"), c.ListenAddress, "must be an IPv4 or IPv6 address without zone"))
		}
	}
	if c.Port < 0 || c.Port > 65535 {
		errs = append(errs, field.Invalid(fldPath.Child("port"), c.Port, "must be between 1 and 65535 (0 selects 3128)"))
	}
	if p := c.UpstreamCountsPort; p < 0 || p > 65535 || (p != 0 && p == c.withDefaults().Port) {
		errs = append(errs, field.Invalid(fldPath.Child("upstreamCountsPort"), p, "must be between 1 and 65535 and not the proxy port (0 selects one)"))
	}
	return errs
}

// validateAuth checks the auth type and what it needs: Basic a credential,
// None narrow sources (the parsed AllowedSourceCIDRs; invalid ones are the
// zero Prefix).
func (c Config) validateAuth(fldPath *field.Path, sources []netip.Prefix) field.ErrorList {
	var errs field.ErrorList
	authPath := fldPath.Child("auth")
	switch c.Auth.Type {
	case AuthBasic:
		errs = append(errs, c.Auth.validateBasic(authPath)...)
		if c.BroadSourcesWithoutAuth {
			errs = append(errs, field.Forbidden(fldPath.Child("broadSourcesWithoutAuth"), "only with auth type None"))
		}
	case AuthNone:
		if c.Auth.Username != "" || c.Auth.Password != "" {
			errs = append(errs, field.Forbidden(authPath, "username and password are only used with type Basic"))
		}
		for i, p := range sources {
			if !c.BroadSourcesWithoutAuth && tooBroadWithoutAuth(p) {
				errs = append(errs, field.Invalid(fldPath.Child("allowedSourceCIDRs").Index(i), c.AllowedSourceCIDRs[i], fmt.Sprintf("with auth type None each range must be /%d or narrower (IPv6 /%d): the source list is the only guard", noAuthMinBitsV4, noAuthMinBitsV6)))
			}
		}
	case "":
		errs = append(errs, field.Required(authPath.Child("type"), "choose Basic (with username and password) or, explicitly, None"))
	default:
		errs = append(errs, field.NotSupported(authPath.Child("type"), c.Auth.Type, []AuthType{AuthBasic, AuthNone}))
	}
	return errs
}

// validateStats checks the operator's counter credential: none, or Basic
// under a username of its own (squid could not tell the two apart).
func (c Config) validateStats(statsPath *field.Path) field.ErrorList {
	switch c.Stats.Type {
	case "":
		if c.Stats.Username != "" || c.Stats.Password != "" {
			return field.ErrorList{field.Required(statsPath.Child("type"), "a counter credential needs type Basic")}
		}
		return nil
	case AuthBasic:
	default:
		return field.ErrorList{field.NotSupported(statsPath.Child("type"), c.Stats.Type, []AuthType{AuthBasic})}
	}
	errs := c.Stats.validateBasic(statsPath)
	if c.Auth.Type == AuthBasic && c.Stats.Username == c.Auth.Username {
		errs = append(errs, field.Invalid(statsPath.Child("username"), c.Stats.Username, "must differ from auth.username: the counters are the operator's, not the clients'"))
	}
	return errs
}

// tooBroadWithoutAuth reports a valid source range wider than auth None
// admits.
func tooBroadWithoutAuth(p netip.Prefix) bool {
	return p.IsValid() && ((p.Addr().Is4() && p.Bits() < noAuthMinBitsV4) || (p.Addr().Is6() && p.Bits() < noAuthMinBitsV6))
}

// validateDestinations checks the extra denied destinations and the
// exceptions to the default denied ones.
func (c Config) validateDestinations(fldPath *field.Path) field.ErrorList {
	extra, errs := parsePrefixes(fldPath.Child("extraDeniedDestinations"), c.ExtraDeniedDestinations)
	exPath := fldPath.Child("allowedDestinationExceptions")
	exceptions, exErrs := parsePrefixes(exPath, c.AllowedDestinationExceptions)
	errs = append(errs, exErrs...)
	for i, e := range exceptions {
		if !e.IsValid() {
			continue
		}
		if a := slices.IndexFunc(alwaysDenied, e.Overlaps); a >= 0 {
			errs = append(errs, field.Invalid(exPath.Index(i), c.AllowedDestinationExceptions[i], "overlaps "+alwaysDenied[a].String()+", which no exception lifts (translation and tunnel prefixes, protocol and multicast blocks); write an internal target in its plain IPv4 or IPv6 form"))
		} else if !insideAny(e, defaultDenied) {
			errs = append(errs, field.Invalid(exPath.Index(i), c.AllowedDestinationExceptions[i], "must lie inside one default denied range ("+strings.Join(DefaultDeniedDestinations, ", ")+"); other destinations are not denied to begin with"))
		}
		for j, d := range extra {
			if d.IsValid() && d.Overlaps(e) {
				errs = append(errs, field.Invalid(exPath.Index(i), c.AllowedDestinationExceptions[i], fmt.Sprintf("overlaps extraDeniedDestinations[%d] %s", j, d)))
			}
		}
	}
	return errs
}

// validatePaths checks the paths squid.conf names, under pathsPath.
func (c Config) validatePaths(pathsPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, p := range []struct {
		name, value string
		none        bool
	}{
		{"passwordFile", c.Paths.PasswordFile, false},
		{"authHelper", c.Paths.AuthHelper, false},
		{"pidFile", c.Paths.PidFile, false},
		{"cacheLog", c.Paths.CacheLog, false},
		{"accessLog", c.Paths.AccessLog, true},
		{"coredumpDir", c.Paths.CoredumpDir, false},
		{"deniedDestinationsFile", c.Paths.DeniedDestinationsFile, false},
		{"upstreamCounter", c.Paths.UpstreamCounter, false},
	} {
		if p.value == "" || (p.none && p.value == "none") {
			continue
		}
		if !strings.HasPrefix(p.value, "/") || strings.ContainsFunc(p.value, unsafeInConfig) {
			errs = append(errs, field.Invalid(pathsPath.Child(p.name), p.value, "must be an absolute path without spaces, quotes, '#', '%' or control characters"))
		}
	}
	return errs
}

// unsafeInConfig reports characters that could end a squid.conf token or
// line, start a comment, or be expanded (%, quotes, $ in macros).
func unsafeInConfig(r rune) bool {
	return unicode.IsSpace(r) || unicode.IsControl(r) || strings.ContainsRune(`#"'%$\`, r) || r > unicode.MaxASCII
}

// validateBasic checks the username and password of type Basic.
func (a Auth) validateBasic(authPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	if !usernamePattern.MatchString(a.Username) {
		errs = append(errs, field.Invalid(authPath.Child("username"), a.Username, "must be 1-64 characters of letters, digits, '.', '_' or '-', starting with a letter or digit"))
	}
	// Never pass the password as a value: field errors end up in events.
	p, pw := authPath.Child("password"), a.Password
	switch {
	case pw == "":
		errs = append(errs, field.Required(p, "type Basic needs a password"))
	case len(pw) < MinPasswordLength:
		errs = append(errs, field.Invalid(p, "(redacted)", fmt.Sprintf("must be at least %d characters", MinPasswordLength)))
	case len(pw) > MaxPasswordLength:
		errs = append(errs, field.TooLong(p, "", MaxPasswordLength))
	case strings.ContainsFunc(pw, unicode.IsControl):
		errs = append(errs, field.Invalid(p, "(redacted)", "must not contain control characters"))
	}
	return errs
}

// parsePrefixes parses canonical CIDRs; invalid entries come back as the
// zero Prefix so indexes stay aligned with the input.
func parsePrefixes(p *field.Path, in []string) ([]netip.Prefix, field.ErrorList) {
	var errs field.ErrorList
	out := make([]netip.Prefix, len(in))
	for i, s := range in {
		pfx, err := netip.ParsePrefix(s)
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(p.Index(i), s, "must be a CIDR such as 192.0.2.0/24 or 2001:db8::/32"))
		case pfx != pfx.Masked():
			errs = append(errs, field.Invalid(p.Index(i), s, "has host bits set; did you mean "+pfx.Masked().String()+"?"))
		case pfx.Addr().Is6() && pfx.Overlaps(v4MappedRange):
			errs = append(errs, field.Invalid(p.Index(i), s, "covers IPv4-mapped addresses (::ffff:0:0/96), which squid confuses with IPv4 entries; write IPv4 ranges in IPv4 form (2000::/3 is all global IPv6)"))
		default:
			out[i] = pfx
		}
	}
	return out, errs
}
