// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// RedisMode is the shape of the Redis a URL points at.
type RedisMode string

// Redis modes.
const (
	// RedisSingle is one server: redis:// or rediss://.
	RedisSingle RedisMode = "single"
	// RedisCluster is a Redis Cluster: redis+cluster:// or rediss+cluster://, with one
	// or more seed addresses.
	RedisCluster RedisMode = "cluster"
	// RedisSentinel is a primary found through Sentinel: redis+sentinel:// or
	// rediss+sentinel://, with the sentinels' addresses and the master's name.
	RedisSentinel RedisMode = "sentinel"
)

// RedisTarget is what a Redis URL names.
type RedisTarget struct {
	Mode RedisMode
	// Addrs are host:port: the server, the cluster's seed nodes, or the sentinels.
	Addrs []string
	// MasterName is the Sentinel master's name (sentinel only).
	MasterName string
	// DB is the database (0 on a cluster, which has no other).
	DB int
	// Username and Password authenticate to the data nodes (the server, the cluster's
	// nodes, the primary Sentinel names); not to the sentinels.
	Username, Password string
	// TLS is true for the rediss schemes.
	TLS bool
}

// ParseRedisURL reads rate_limiting.redis.url:
//
//	redis://[user:password@]host:port[/db]                       one server (rediss:// for TLS)
//	redis+cluster://[user:password@]host:port[,host:port...]     a Redis Cluster (rediss+cluster:// for TLS)
//	redis+sentinel://[user:password@]host:port[,host:port...]/MASTER[/db]
//
// A cluster's addresses are seeds: the client discovers the others. A sentinel URL's
// addresses are the sentinels'; the user and password are the primary's (the
// sentinels' own password is rate_limiting.redis.sentinel_password_env).
func ParseRedisURL(raw string) (RedisTarget, error) {
	// url.Parse reads one host: the address list is taken out before it parses the
	// rest, and read here.
	hosts, masked := splitHosts(raw)
	u, err := url.Parse(masked)
	if err != nil {
		return RedisTarget{}, fmt.Errorf("not a URL: %w", err)
	}
	var t RedisTarget
	switch u.Scheme {
	case "redis", "rediss":
		t.Mode = RedisSingle
	case "redis+cluster", "rediss+cluster":
		t.Mode = RedisCluster
	case "redis+sentinel", "rediss+sentinel":
		t.Mode = RedisSentinel
	case "redis-sentinel", "sentinel":
		return RedisTarget{}, fmt.Errorf("a Sentinel URL is redis+sentinel://SENTINEL:26379[,SENTINEL:26379...]/MASTER_NAME, got scheme %q", u.Scheme)
	default:
		return RedisTarget{}, fmt.Errorf("must be a redis://, rediss://, redis+cluster:// or redis+sentinel:// URL, got scheme %q", u.Scheme)
	}
	t.TLS = strings.HasPrefix(u.Scheme, "rediss")
	if u.User != nil {
		t.Username = u.User.Username()
		t.Password, _ = u.User.Password()
	}
	if hosts == "" {
		return RedisTarget{}, fmt.Errorf("must name a host, got %q", raw)
	}
	for _, a := range strings.Split(hosts, ",") {
		if a == "" {
			return RedisTarget{}, fmt.Errorf("an empty address in %q", u.Host)
		}
		t.Addrs = append(t.Addrs, withPort(a, t.Mode))
	}
	for _, a := range u.Query()["addr"] {
		t.Addrs = append(t.Addrs, withPort(a, t.Mode))
	}
	path := strings.Trim(u.Path, "/")
	switch t.Mode {
	case RedisSingle:
		if len(t.Addrs) > 1 {
			return RedisTarget{}, fmt.Errorf("several addresses name a Redis Cluster: write redis+cluster://%s", strings.Join(t.Addrs, ","))
		}
		if t.DB, err = parseDB(path); err != nil {
			return RedisTarget{}, err
		}
	case RedisCluster:
		if path != "" && path != "0" {
			return RedisTarget{}, fmt.Errorf("a Redis Cluster has only database 0, got %q", u.Path)
		}
	case RedisSentinel:
		name, db, _ := strings.Cut(path, "/")
		if name == "" {
			return RedisTarget{}, fmt.Errorf("a Sentinel URL names the master after the addresses: redis+sentinel://%s/MASTER_NAME", hosts)
		}
		t.MasterName = name
		if t.DB, err = parseDB(db); err != nil {
			return RedisTarget{}, err
		}
	}
	return t, nil
}

// splitHosts takes the host list out of a URL's authority: it returns the list and
// the URL with a one-word host in its place.
func splitHosts(raw string) (hosts, masked string) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return "", raw
	}
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	authority := rest[:end]
	at := strings.LastIndexByte(authority, '@')
	hosts = authority[at+1:]
	placeholder := "host"
	if hosts == "" {
		placeholder = ""
	}
	return hosts, scheme + "://" + authority[:at+1] + placeholder + rest[end:]
}

// withPort adds the mode's default port to an address that has none.
func withPort(a string, m RedisMode) string {
	if strings.LastIndexByte(a, ':') > strings.LastIndexByte(a, ']') {
		return a
	}
	if m == RedisSentinel {
		return a + ":26379"
	}
	return a + ":6379"
}

func parseDB(s string) (int, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("the database must be a number, got %q", s)
	}
	return n, nil
}
