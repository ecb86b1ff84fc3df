package v1alpha1

import "crawl.example.com/proxy-operator/controllers"

// proxyWebhook is the Proxy webhook as main.go builds it: the manager's
// registration list, image URLs admitted only with allowURLs
// (--allow-proxy-image-urls).
func proxyWebhook(allowURLs bool) *ProxyWebhook {
	return &ProxyWebhook{AllowImageURLs: allowURLs, Plugins: controllers.Plugins()}
}

// poolWebhook is the ProxyPool webhook as main.go builds it.
func poolWebhook() *ProxyPoolWebhook {
	return &ProxyPoolWebhook{Proxy: *proxyWebhook(false)}
}
