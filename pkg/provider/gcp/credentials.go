package gcp

import (
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"google.golang.org/api/option"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// credentialsOption turns Options' credentials into a client option, or nil
// for Application Default Credentials. The JSON is read and checked here,
// before the client library sees it, so that a bad key is reported with a
// class instead of surfacing later as an opaque token error:
//
//   - a missing file is transient: the Secret may not be mounted yet, and the
//     registry retries construction;
//   - bytes that are not a credential we accept are permanent: retrying the
//     same bytes cannot help, someone must fix the Secret.
//
// The type is pinned from the document's own "type" field through the
// type-specific option (WithAuthCredentialsJSON), as the library asks of
// callers that load credentials from configuration; the configuration is
// the operator administrator's, so it is trusted to name its type.
func credentialsOption(o Options) (option.ClientOption, error) {
	data := o.CredentialsJSON
	src := "credentials JSON"
	switch {
	case len(o.CredentialsJSON) > 0 && o.CredentialsFile != "":
		return nil, provider.Permanentf("gcp: set CredentialsJSON or CredentialsFile, not both")
	case o.CredentialsFile != "":
		src = "credentials file " + o.CredentialsFile
		b, err := os.ReadFile(o.CredentialsFile)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, provider.Transientf("gcp: %s does not exist (Secret not mounted yet?)", src)
		}
		if err != nil {
			return nil, provider.Transientf("gcp: read %s: %w", src, err)
		}
		data = b
	case len(o.CredentialsJSON) == 0:
		return nil, nil
	}
	typ, err := checkCredentials(data)
	if err != nil {
		return nil, provider.Permanentf("gcp: %s: %w", src, err)
	}
	return option.WithAuthCredentialsJSON(typ, data), nil
}

// credentialFile is the part of a Google credential document we check.
type credentialFile struct {
	Type         string `json:"type"`
	ClientEmail  string `json:"client_email"`
	PrivateKey   string `json:"private_key"`
	ClientID     string `json:"client_id"`
	ClientSecret string `json:"client_secret"`
	RefreshToken string `json:"refresh_token"`
	Audience     string `json:"audience"`
	SourceCreds  any    `json:"source_credentials"`
}

// checkCredentials validates a credential document and returns its type.
// It never logs or returns key material.
func checkCredentials(data []byte) (option.CredentialsType, error) {
	var f credentialFile
	if err := json.Unmarshal(data, &f); err != nil {
		return "", fmt.Errorf("not a JSON credential document: %w", jsonSyntaxOnly(err))
	}
	switch option.CredentialsType(f.Type) {
	case option.ServiceAccount:
		if f.ClientEmail == "" || f.PrivateKey == "" {
			return "", errors.New("service_account credential lacks client_email or private_key")
		}
		if b, _ := pem.Decode([]byte(f.PrivateKey)); b == nil {
			return "", errors.New("service_account private_key is not PEM")
		}
		return option.ServiceAccount, nil
	case option.AuthorizedUser:
		if f.ClientID == "" || f.ClientSecret == "" || f.RefreshToken == "" {
			return "", errors.New("authorized_user credential lacks client_id, client_secret or refresh_token")
		}
		return option.AuthorizedUser, nil
	case option.ExternalAccount:
		if f.Audience == "" {
			return "", errors.New("external_account credential lacks audience")
		}
		return option.ExternalAccount, nil
	case option.ImpersonatedServiceAccount:
		if f.SourceCreds == nil {
			return "", errors.New("impersonated_service_account credential lacks source_credentials")
		}
		return option.ImpersonatedServiceAccount, nil
	case "":
		return "", errors.New(`credential has no "type"`)
	default:
		return "", fmt.Errorf("unsupported credential type %q", f.Type)
	}
}

// jsonSyntaxOnly keeps a JSON error's position but never echoes input (the
// input is a private key).
func jsonSyntaxOnly(err error) error {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("syntax error at offset %d", se.Offset)
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Errorf("field %q has the wrong type", te.Field)
	}
	return errors.New("malformed")
}
