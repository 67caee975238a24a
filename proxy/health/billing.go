// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package health

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"
	"unicode"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// Reason is why a credential cools.
type Reason string

// Reasons.
const (
	// ReasonRate: a 429 of rate pressure; the cooldown ends at its interval.
	ReasonRate Reason = "rate"
	// ReasonBilling: the provider account is out of credit or over its spend limit;
	// the cooldown holds until a probe finds the account answering again.
	ReasonBilling Reason = "billing"
)

// Cooling is a credential's cooldown as it is in force: why, since and until when,
// the interval the provider asked for and the one applied, and for billing the
// provider's code and message.
type Cooling struct {
	Reason    Reason        `json:"reason"`
	Since     time.Time     `json:"since"`
	Until     time.Time     `json:"until"`
	Requested time.Duration `json:"requested"`
	Applied   time.Duration `json:"applied"`
	Source    Source        `json:"source,omitempty"`
	// Upstream is the upstream whose answer started it.
	Upstream string `json:"upstream,omitempty"`
	Code     string `json:"code,omitempty"`
	Message  string `json:"message,omitempty"`
}

// openAIBilling are OpenAI's error codes (error.code, or error.type) of an account
// out of credit or over a spend or usage limit: each comes on a 429 or a 400, and
// waiting a rate interval does not end it.
var openAIBilling = map[string]bool{
	"insufficient_quota":                true,
	"credit_balance_exhausted":          true,
	"organization_spend_limit_exceeded": true,
	"project_spend_limit_exceeded":      true,
	"organization_usage_limit_exceeded": true,
	"billing_hard_limit_reached":        true,
	"billing_not_active":                true,
}

// anthropicBilling are the message openings of Anthropic's billing refusals that come
// as a 400 invalid_request_error (its 402 billing_error needs no reading).
var anthropicBilling = []string{
	"your credit balance is too low",
	"you have reached your specified api usage limits",
	"you have reached your specified workspace api usage limits",
}

// maxMessage bounds the provider's message kept with a billing cooldown.
const maxMessage = 300

// Billing reads an upstream's error answer (its status and the start of its body) for
// an account out of credit: a 402, an error type billing_error, an OpenAI billing code
// (openAIBilling) or an Anthropic billing message (anthropicBilling). It returns the
// provider's code and message, ok false for any other answer.
func Billing(status int, body []byte) (code, message string, ok bool) {
	if status < 400 || status >= 500 {
		return "", "", false
	}
	var e struct {
		Error json.RawMessage `json:"error"`
	}
	var inner struct {
		Type    string `json:"type"`
		Code    any    `json:"code"`
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &e) == nil && len(e.Error) > 0 {
		_ = json.Unmarshal(e.Error, &inner)
	}
	c, _ := inner.Code.(string)
	message = clean(inner.Message)
	switch {
	case openAIBilling[c]:
		return c, message, true
	case openAIBilling[inner.Type]:
		return inner.Type, message, true
	case inner.Type == "billing_error", status == http.StatusPaymentRequired:
		code = inner.Type
		if code == "" {
			code = "payment_required"
		}
		return code, message, true
	}
	lower := strings.ToLower(message)
	for _, p := range anthropicBilling {
		if strings.HasPrefix(lower, p) {
			return inner.Type, message, true
		}
	}
	return "", "", false
}

// clean bounds a provider's message and drops its control characters.
func clean(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.TrimSpace(s))
	if r := []rune(s); len(r) > maxMessage {
		s = string(r[:maxMessage]) + "…"
	}
	return s
}

// BillingFor is a billing cooldown's interval: the answer's timing (read as
// CooldownFor reads a 429's, uncapped) when it asks for longer than configured, else
// the configured interval; capped at config.MaxBillingCooldown.
func BillingFor(h http.Header, now time.Time, configured time.Duration) Interval {
	var iv Interval
	iv.Requested, iv.Source = asked(h, now)
	iv.Applied = max(configured, iv.Requested)
	if iv.Applied > config.MaxBillingCooldown {
		iv.Applied, iv.Clamped = config.MaxBillingCooldown, iv.Requested > config.MaxBillingCooldown
	}
	if iv.Requested < configured {
		iv.Source = SourceConfig
	}
	return iv
}

// BillAnswer puts the credential on a billing cooldown for upstream's answer that
// the provider account is out of credit (code and message as Billing reads them, h
// its headers), for BillingFor's interval, which it returns.
func (c *Cooldown) BillAnswer(upstream, code, message string, h http.Header, now time.Time, configured time.Duration) Interval {
	iv := BillingFor(h, now, configured)
	c.Bill(Cooling{Since: now, Until: now.Add(iv.Applied), Requested: iv.Requested, Applied: iv.Applied,
		Source: iv.Source, Upstream: upstream, Code: code, Message: message})
	return iv
}
