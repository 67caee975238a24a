// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/stack"
)

// The official Node SDKs, pinned in test/e2e/node/package-lock.json: openai 6.x and
// @anthropic-ai/sdk 1.x. Each scenario of node/sdks.mjs runs in its own node process
// against a proxy of a fleet and prints what it saw as JSON.
var _ = Describe("The official Node SDKs through a fleet", Ordered, func() {
	var (
		p   *stack.Proxy
		dir string
	)
	BeforeAll(func() {
		dir = filepath.Join(root, "test", "e2e", "node")
		installNodeSDKs(dir)
		ns := namespace()
		// carol's own quota holds one request, refilled in a second.
		p = fleet(ns, 1, "{type: Memory}", budgetManifest("per-key", "PerAPIKey", 3000), keyManifest("carol", ", requestsPerSecond: 1, burstCapacity: 1"))[0]
		st.LLM.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 5})
	})

	words := func(s string) int { return strings.Count(s, "word") }

	It("answers plain, streamed and helper calls on chat, Responses and Messages, with the budget headers withResponse() reads", func() {
		var out struct {
			Chat struct {
				Text         string
				PromptTokens int
				Headers      map[string]*string
			}
			ChatStream struct {
				Text             string
				CompletionTokens int
			}
			ChatHelper struct {
				Role, Text string
				Deltas     int
			}
			Responses struct {
				Text        string
				InputTokens int
			}
			ResponsesStream struct{ Text string }
			ResponsesHelper struct {
				Text                 string
				OutputTokens, Deltas int
			}
			Messages struct {
				Text        string
				InputTokens int
				Headers     map[string]*string
			}
			Parse          struct{ Chat, Responses string }
			MessagesStream struct{ Text string }
			MessagesHelper struct {
				Text, StreamedText, FinalText string
				OutputTokens                  int
			}
		}
		runNode(dir, &out, "calls", "OPENAI_KEY=sk-e2e-alice", "ANTHROPIC_KEY=sk-e2e-bob", "TOKENWARDEN_URL="+p.URL)

		Expect(out.Chat.PromptTokens).To(Equal(10))
		Expect(words(out.Chat.Text)).To(Equal(5))
		h := out.Chat.Headers
		Expect(h["x-ratelimit-limit-tokens"]).To(HaveValue(Equal("3000")))
		Expect(h["x-ratelimit-remaining-tokens"]).To(HaveValue(Equal(*h["x-ratelimit-tokens-remaining"])))
		Expect(h["x-ratelimit-reset-tokens"]).To(HaveValue(HaveSuffix("s")), "OpenAI's duration spelling")
		Expect(h["anthropic-ratelimit-tokens-limit"]).To(BeNil(), "Anthropic's names only on Anthropic routes")

		Expect(words(out.ChatStream.Text)).To(Equal(5))
		Expect(out.ChatStream.CompletionTokens).To(Equal(5))
		Expect(out.ChatHelper.Role).To(Equal("assistant"), "chat.completions.stream() needs the role in the first delta")
		Expect(words(out.ChatHelper.Text)).To(Equal(5))
		Expect(out.ChatHelper.Deltas).To(Equal(5))

		Expect(out.Responses.InputTokens).To(Equal(10))
		Expect(words(out.Responses.Text)).To(Equal(5))
		Expect(words(out.ResponsesStream.Text)).To(Equal(5))
		Expect(out.ResponsesHelper.Text).To(Equal(out.ResponsesStream.Text), "responses.stream() needs the item events")
		Expect(out.ResponsesHelper.OutputTokens).To(Equal(5))
		Expect(out.ResponsesHelper.Deltas).To(Equal(5))
		Expect(words(out.Parse.Chat)).To(Equal(5), "chat.completions.parse()")
		Expect(words(out.Parse.Responses)).To(Equal(5), "responses.parse()")

		Expect(out.Messages.InputTokens).To(Equal(10))
		Expect(words(out.Messages.Text)).To(Equal(5))
		h = out.Messages.Headers
		Expect(h["anthropic-ratelimit-tokens-limit"]).To(HaveValue(Equal("3000")))
		Expect(h["anthropic-ratelimit-tokens-remaining"]).To(HaveValue(Equal(*h["x-ratelimit-tokens-remaining"])))
		Expect(h["anthropic-ratelimit-tokens-reset"]).NotTo(BeNil())
		reset, err := time.Parse(time.RFC3339, *h["anthropic-ratelimit-tokens-reset"])
		Expect(err).NotTo(HaveOccurred(), "the reset is an RFC 3339 time")
		Expect(reset).To(BeTemporally("~", time.Now(), 2*time.Minute))
		Expect(words(out.MessagesStream.Text)).To(Equal(5))
		Expect(out.MessagesHelper.Text).To(Equal(out.MessagesHelper.StreamedText))
		Expect(out.MessagesHelper.FinalText).To(Equal(out.MessagesHelper.Text))
		Expect(words(out.MessagesHelper.Text)).To(Equal(5))
		Expect(out.MessagesHelper.OutputTokens).To(Equal(5))
	})

	It("retries a 429 after retry-after-ms, in both SDKs", func() {
		type call struct{ Attempts, Ms int }
		var out struct{ OpenAI, Anthropic call }
		st.LLM.Reset()
		runNode(dir, &out, "retry", "OPENAI_KEY=sk-e2e-carol", "ANTHROPIC_KEY=sk-e2e-carol", "TOKENWARDEN_URL="+p.URL)
		for name, c := range map[string]call{"openai": out.OpenAI, "@anthropic-ai/sdk": out.Anthropic} {
			Expect(c.Attempts).To(Equal(2), "%s: refused once, then admitted", name)
			Expect(c.Ms).To(BeNumerically(">=", 800), "%s waited for retry-after-ms", name)
		}
		Expect(st.LLM.Requests()).To(HaveLen(3), "only the admitted attempts reached the backend")
	})

	It("fails at once, with the proxy's message, on a request larger than the key's whole budget", func() {
		type failure struct {
			Error                   string
			Status                  int
			Message                 string
			ShouldRetry, RetryAfter *string
			Attempts, Ms            int
		}
		var out struct{ OpenAI, Anthropic failure }
		st.LLM.Reset()
		runNode(dir, &out, "too-large", "OPENAI_KEY=sk-e2e-alice", "ANTHROPIC_KEY=sk-e2e-alice", "MAX_TOKENS=5000", "TOKENWARDEN_URL="+p.URL)
		for name, f := range map[string]failure{"openai": out.OpenAI, "@anthropic-ai/sdk": out.Anthropic} {
			Expect(f.Error).To(Equal("RateLimitError"), name)
			Expect(f.Status).To(Equal(429), name)
			Expect(f.Attempts).To(Equal(1), "%s obeyed x-should-retry: false and did not retry", name)
			Expect(f.ShouldRetry).To(HaveValue(Equal("false")), name)
			Expect(f.RetryAfter).NotTo(BeNil(), "%s: Retry-After stays, as information", name)
			Expect(f.Message).To(ContainSubstring("more than the whole minute budget of the api_key dimension holds (3000 tokens)"), name)
			// Without x-should-retry the SDK would sleep the Retry-After (over 100 s here)
			// twice; the bound is loose only for a loaded machine.
			Expect(f.Ms).To(BeNumerically("<", 10000), name)
		}
		Expect(st.LLM.Requests()).To(BeEmpty())
	})
})

// runNode runs one scenario of node/sdks.mjs with env and decodes what it prints.
func runNode(dir string, out any, scenario string, env ...string) {
	GinkgoHelper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "sdks.mjs", scenario)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	Expect(err).NotTo(HaveOccurred(), "node sdks.mjs %s:\n%s%s", scenario, stdout.String(), stderr.String())
	GinkgoWriter.Printf("node sdks.mjs %s (%v): %s\n", scenario, took.Round(time.Millisecond), stdout.String())
	AddReportEntry("node sdks.mjs "+scenario, took.Round(time.Millisecond).String())
	Expect(json.Unmarshal(stdout.Bytes(), out)).To(Succeed(), "%s", stdout.String())
}

// installNodeSDKs installs the pinned SDKs with `npm ci` into dir/node_modules (which
// git ignores), and reuses that install while package-lock.json is unchanged: a
// stamp in node_modules holds the digest of the lock it came from. A machine without
// Node.js and npm fails the suite: the SDKs are part of what it proves.
func installNodeSDKs(dir string) {
	GinkgoHelper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			Fail(tool + " is not on PATH: the end-to-end suite runs the official Node SDKs; install Node.js 18 or later and npm " +
				"(Debian's nodejs and npm packages; .ci/run installs them when missing)")
		}
	}
	v, err := exec.Command("node", "--version").Output()
	Expect(err).NotTo(HaveOccurred())
	major, _ := strconv.Atoi(strings.SplitN(strings.TrimPrefix(strings.TrimSpace(string(v)), "v"), ".", 2)[0])
	Expect(major).To(BeNumerically(">=", 18), "node %s is too old for the SDKs: Node.js 18 or later is needed", v)

	lock, err := os.ReadFile(filepath.Join(dir, "package-lock.json"))
	Expect(err).NotTo(HaveOccurred())
	sum := sha256.Sum256(lock)
	want := hex.EncodeToString(sum[:])
	stamp := filepath.Join(dir, "node_modules", ".tokenwarden-lock-sha256")
	if got, err := os.ReadFile(stamp); err == nil && string(got) == want {
		AddReportEntry("npm ci", "reused the install of this package-lock.json")
		return
	}
	start := time.Now()
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "npm ci in %s:\n%s", dir, out)
	Expect(os.WriteFile(stamp, []byte(want), 0o644)).To(Succeed())
	AddReportEntry("npm ci", fmt.Sprintf("installed the Node SDKs in %v", time.Since(start).Round(time.Millisecond)))
}
