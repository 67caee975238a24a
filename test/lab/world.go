// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package lab runs a synthetic world (four chat apps, a batch job and a runaway
// agent) through the real proxy against a simulated backend of replicas with a
// linear step-time model, and reports each mission's outcome as a table and an HTML
// chart. world.yaml is the world; docs/scheduling.md "The lab" explains it.
package lab

import (
	_ "embed"
	"fmt"
	"os"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// DefaultWorld is the checked-in world.yaml.
//
//go:embed world.yaml
var DefaultWorld []byte

// World is the lab's traffic, backend and mission parameters.
type World struct {
	// DurationSeconds is the world time traffic is sent for.
	DurationSeconds float64 `json:"duration_seconds"`
	// TimeScale is world seconds per wall second.
	TimeScale float64 `json:"time_scale"`
	// InteractiveTargetSeconds is the start-within target of chat requests.
	InteractiveTargetSeconds float64 `json:"interactive_target_seconds"`
	// Seed fixes the arrival times.
	Seed int64 `json:"seed"`
	// AnswerSpread draws each answer uniformly within ± this fraction of its tenant's
	// answer (0: every answer the same length).
	AnswerSpread float64 `json:"answer_spread"`
	Backend      Backend `json:"backend"`
	// Scheduler is the proxy's scheduling block in the runs that use it.
	Scheduler Scheduler `json:"scheduler"`
	Tenants   []Tenant  `json:"tenants"`
	Burst     Burst     `json:"burst"`
	Missions  Missions  `json:"missions"`
}

// Backend is the simulated inference backend.
type Backend struct {
	Replicas int `json:"replicas"`
	// MaxBatch is the sequences one replica runs at once.
	MaxBatch int `json:"max_batch"`
	// KVTokens is the context (prompt and answer tokens) one replica holds for its
	// running sequences; a request waits until it fits (0: no bound).
	KVTokens int64 `json:"kv_tokens"`
	// StepBaseMillis and StepPerTokenMillis are a and b of step time = a + b × tokens.
	StepBaseMillis     float64 `json:"step_base_ms"`
	StepPerTokenMillis float64 `json:"step_per_token_ms"`
}

// Scheduler is the proxy's scheduling block, in world seconds; what it leaves out
// (0) is the proxy's default.
type Scheduler struct {
	AgingSeconds        int64 `json:"aging_seconds,omitempty"`
	MaxQueueWaitSeconds int64 `json:"max_queue_wait_seconds,omitempty"`
	// BatchMinSharePercent and BackgroundMinSharePercent are the classes'
	// min_share_percent.
	BatchMinSharePercent      int64 `json:"batch_min_share_percent,omitempty"`
	BackgroundMinSharePercent int64 `json:"background_min_share_percent,omitempty"`
	// CapacityHeadroom is the share of the replicas' KV caches the upstream's
	// max_in_flight_tokens leaves out (World.CapacityTokens).
	CapacityHeadroom float64 `json:"capacity_headroom"`
}

// knobs is the proxy's scheduling block's fields the world sets, as YAML flow fields.
func (s Scheduler) knobs() string {
	var out []string
	if s.AgingSeconds > 0 {
		out = append(out, fmt.Sprintf("aging_seconds: %d", s.AgingSeconds))
	}
	if s.MaxQueueWaitSeconds > 0 {
		out = append(out, fmt.Sprintf("max_queue_wait_seconds: %d", s.MaxQueueWaitSeconds))
	}
	var classes []string
	if s.BatchMinSharePercent > 0 {
		classes = append(classes, fmt.Sprintf("batch: {min_share_percent: %d}", s.BatchMinSharePercent))
	}
	if s.BackgroundMinSharePercent > 0 {
		classes = append(classes, fmt.Sprintf("background: {min_share_percent: %d}", s.BackgroundMinSharePercent))
	}
	if len(classes) > 0 {
		out = append(out, "classes: {"+strings.Join(classes, ", ")+"}")
	}
	return strings.Join(out, ", ")
}

// Tenant kinds.
const (
	KindChat  = "chat"
	KindBatch = "batch"
	KindAgent = "agent"
)

// Tenant is one API key's traffic.
type Tenant struct {
	Name string `json:"name"`
	// Kind is chat, batch or agent.
	Kind string `json:"kind"`
	// Class is the key's priority class when the scheduler runs.
	Class string `json:"class"`
	// Rate is requests per world second; HeavyRate the batch backlog's.
	Rate      float64 `json:"rate"`
	HeavyRate float64 `json:"heavy_rate,omitempty"`
	// Prompt is the input tokens; an agent's grow linearly to PromptEnd over the
	// RunSteps steps of each of its runs (each step resends the growing conversation),
	// and a new run starts again at Prompt.
	Prompt    int64 `json:"prompt"`
	PromptEnd int64 `json:"prompt_end,omitempty"`
	RunSteps  int   `json:"run_steps,omitempty"`
	// Answer is the output tokens generated; MaxTokens what the request reserves.
	Answer    int64 `json:"answer"`
	MaxTokens int64 `json:"max_tokens"`
	// StartSeconds is when an agent starts sending.
	StartSeconds float64 `json:"start_seconds,omitempty"`
}

// Burst multiplies the chat apps' rate for a while.
type Burst struct {
	StartSeconds float64 `json:"start_seconds"`
	Seconds      float64 `json:"seconds"`
	Multiplier   float64 `json:"multiplier"`
}

// Missions are the limits and targets of the lab's four missions.
type Missions struct {
	RequestsPerMinute          int64     `json:"requests_per_minute"`
	TokenLimitPerMinute        int64     `json:"token_limit_per_minute"`
	TokenLimitBucketSeconds    float64   `json:"token_limit_bucket_seconds"`
	AppContractPerMinute       int64     `json:"app_contract_per_minute"`
	BucketSeconds              []float64 `json:"bucket_seconds"`
	BatchOutputTokensPerSecond float64   `json:"batch_output_tokens_per_second"`
	InteractiveWithinTarget    float64   `json:"interactive_within_target"`
	ScheduledLimitPerMinute    int64     `json:"scheduled_limit_per_minute"`
	StaticLimitsPerMinute      []int64   `json:"static_limits_per_minute"`
	AgentLimitPerMinute        int64     `json:"agent_limit_per_minute"`
	BatchLimitPerMinute        int64     `json:"batch_limit_per_minute"`
}

// LoadWorld reads a world file; empty path is the checked-in world.
func LoadWorld(path string) (*World, error) {
	data := DefaultWorld
	if path != "" {
		var err error
		if data, err = os.ReadFile(path); err != nil {
			return nil, err
		}
	}
	return ParseWorld(data)
}

// ParseWorld decodes a world document strictly and validates it; an error names the
// field.
func ParseWorld(data []byte) (*World, error) {
	var w World
	if err := yaml.UnmarshalStrict(data, &w); err != nil {
		return nil, fmt.Errorf("world: %w", err)
	}
	if err := w.validate(); err != nil {
		return nil, fmt.Errorf("world: %w", err)
	}
	return &w, nil
}

func (w *World) validate() error {
	positive := []struct {
		field string
		v     float64
	}{
		{"duration_seconds", w.DurationSeconds},
		{"time_scale", w.TimeScale},
		{"interactive_target_seconds", w.InteractiveTargetSeconds},
		{"backend.replicas", float64(w.Backend.Replicas)},
		{"backend.max_batch", float64(w.Backend.MaxBatch)},
		{"backend.step_base_ms", w.Backend.StepBaseMillis},
	}
	for _, p := range positive {
		if !(p.v > 0) {
			return fmt.Errorf("%s must be positive, got %v", p.field, p.v)
		}
	}
	for _, k := range []struct {
		field string
		v     int64
	}{
		{"scheduler.aging_seconds", w.Scheduler.AgingSeconds},
		{"scheduler.max_queue_wait_seconds", w.Scheduler.MaxQueueWaitSeconds},
		{"scheduler.batch_min_share_percent", w.Scheduler.BatchMinSharePercent},
		{"scheduler.background_min_share_percent", w.Scheduler.BackgroundMinSharePercent},
	} {
		if k.v < 0 {
			return fmt.Errorf("%s must not be negative (absent: the proxy's default), got %d", k.field, k.v)
		}
	}
	if w.Backend.StepPerTokenMillis < 0 {
		return fmt.Errorf("backend.step_per_token_ms must not be negative, got %v", w.Backend.StepPerTokenMillis)
	}
	if len(w.Tenants) == 0 {
		return fmt.Errorf("tenants must name at least one tenant")
	}
	seen := map[string]bool{}
	for i, t := range w.Tenants {
		f := fmt.Sprintf("tenants[%d]", i)
		switch {
		case t.Name == "":
			return fmt.Errorf("%s.name must not be empty", f)
		case seen[t.Name]:
			return fmt.Errorf("%s.name %q is given twice", f, t.Name)
		case t.Kind != KindChat && t.Kind != KindBatch && t.Kind != KindAgent:
			return fmt.Errorf("%s.kind must be chat, batch or agent, got %q", f, t.Kind)
		case t.Class != "interactive" && t.Class != "batch" && t.Class != "background":
			return fmt.Errorf("%s.class must be interactive, batch or background, got %q", f, t.Class)
		case t.Rate < 0 || t.HeavyRate < 0:
			return fmt.Errorf("%s.rate must not be negative", f)
		case t.Prompt <= 0:
			return fmt.Errorf("%s.prompt must be positive, got %d", f, t.Prompt)
		case t.Answer <= 0:
			return fmt.Errorf("%s.answer must be positive, got %d", f, t.Answer)
		case t.MaxTokens < t.Answer:
			return fmt.Errorf("%s.max_tokens must be at least the answer (%d), got %d", f, t.Answer, t.MaxTokens)
		}
		seen[t.Name] = true
	}
	if w.AnswerSpread < 0 || w.AnswerSpread >= 1 {
		return fmt.Errorf("answer_spread must be in [0, 1), got %v", w.AnswerSpread)
	}
	if w.Burst.Multiplier < 0 || w.Burst.Seconds < 0 {
		return fmt.Errorf("burst.multiplier and burst.seconds must not be negative")
	}
	return nil
}

// Duration is the world's traffic time.
func (w *World) Duration() time.Duration { return seconds(w.DurationSeconds) }

// Target is the interactive start target.
func (w *World) Target() time.Duration { return seconds(w.InteractiveTargetSeconds) }

// Slots is the backend's sequences at once over all replicas.
func (w *World) Slots() int { return w.Backend.Replicas * w.Backend.MaxBatch }

// Of returns the tenants of a kind.
func (w *World) Of(kind string) []Tenant {
	var out []Tenant
	for _, t := range w.Tenants {
		if t.Kind == kind {
			out = append(out, t)
		}
	}
	return out
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
