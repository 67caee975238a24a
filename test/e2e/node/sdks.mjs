// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// The official Node SDKs (openai, @anthropic-ai/sdk) through a tokenwarden proxy, as a
// Node.js user calls them. The end-to-end suite (test/e2e/node_test.go) runs one
// scenario per process and asserts on the JSON it prints on stdout:
//
//	node sdks.mjs calls|retry|too-large
//
// Environment: TOKENWARDEN_URL (the proxy), OPENAI_KEY and ANTHROPIC_KEY (tokenwarden
// keys), and for too-large MAX_TOKENS (a ceiling larger than the key's whole budget).

import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';

const base = process.env.TOKENWARDEN_URL;
if (!base) {
  console.error('TOKENWARDEN_URL is not set');
  process.exit(2);
}

// attempts counts the HTTP requests each client sends, retries included.
const attempts = { openai: 0, anthropic: 0 };
const counting = (name) => (url, init) => {
  attempts[name]++;
  return fetch(url, init);
};

function clients(maxRetries) {
  return {
    openai: new OpenAI({ baseURL: `${base}/v1`, apiKey: process.env.OPENAI_KEY, maxRetries, fetch: counting('openai') }),
    anthropic: new Anthropic({ baseURL: base, apiKey: process.env.ANTHROPIC_KEY, maxRetries, fetch: counting('anthropic') }),
  };
}

const chat = { model: 'demo', messages: [{ role: 'user', content: 'Summarise the catalogue.' }], max_tokens: 200 };
const message = { model: 'claude-demo', max_tokens: 200, messages: [{ role: 'user', content: 'Summarise the catalogue.' }] };

// calls: plain, streamed and helper calls (stream, parse) on chat, Responses and
// Messages, and the budget headers read with withResponse().
async function calls() {
  const { openai, anthropic } = clients(0);
  const out = {};

  const { data: completion, response: chatResponse } = await openai.chat.completions.create(chat).withResponse();
  out.chat = {
    text: completion.choices[0].message.content,
    promptTokens: completion.usage.prompt_tokens,
    headers: pick(chatResponse.headers, 'x-ratelimit-limit-tokens', 'x-ratelimit-remaining-tokens', 'x-ratelimit-reset-tokens',
      'x-ratelimit-tokens-remaining', 'anthropic-ratelimit-tokens-limit'),
  };

  let streamed = '';
  let streamUsage;
  for await (const chunk of await openai.chat.completions.create({ ...chat, stream: true, stream_options: { include_usage: true } })) {
    streamed += chunk.choices[0]?.delta?.content ?? '';
    streamUsage = chunk.usage ?? streamUsage;
  }
  out.chatStream = { text: streamed, completionTokens: streamUsage?.completion_tokens };

  const helper = openai.chat.completions.stream(chat);
  let helperDeltas = 0;
  helper.on('content', () => helperDeltas++);
  const final = await helper.finalChatCompletion();
  out.chatHelper = { role: final.choices[0].message.role, text: final.choices[0].message.content, deltas: helperDeltas };

  const resp = await openai.responses.create({ model: 'demo', input: 'hi', max_output_tokens: 100 });
  out.responses = { text: resp.output_text, inputTokens: resp.usage.input_tokens };

  let respDeltas = '';
  for await (const event of await openai.responses.create({ model: 'demo', input: 'hi', max_output_tokens: 100, stream: true })) {
    if (event.type === 'response.output_text.delta') respDeltas += event.delta;
  }
  out.responsesStream = { text: respDeltas };

  const rs = openai.responses.stream({ model: 'demo', input: 'hi', max_output_tokens: 100 });
  let rsDeltas = 0;
  rs.on('response.output_text.delta', () => rsDeltas++);
  const finalResponse = await rs.finalResponse();
  out.responsesHelper = { text: finalResponse.output_text, outputTokens: finalResponse.usage.output_tokens, deltas: rsDeltas };

  // The parse helpers, with no schema: the text comes back as it is.
  const parsedChat = await openai.chat.completions.parse(chat);
  const parsedResponse = await openai.responses.parse({ model: 'demo', input: 'hi', max_output_tokens: 100 });
  out.parse = { chat: parsedChat.choices[0].message.content, responses: parsedResponse.output_text };

  const { data: msg, response: msgResponse } = await anthropic.messages.create(message).withResponse();
  out.messages = {
    text: msg.content[0].text,
    inputTokens: msg.usage.input_tokens,
    headers: pick(msgResponse.headers, 'anthropic-ratelimit-tokens-limit', 'anthropic-ratelimit-tokens-remaining',
      'anthropic-ratelimit-tokens-reset', 'x-ratelimit-tokens-remaining'),
  };

  let msgStreamed = '';
  for await (const event of await anthropic.messages.create({ ...message, stream: true })) {
    if (event.type === 'content_block_delta' && event.delta.type === 'text_delta') msgStreamed += event.delta.text;
  }
  out.messagesStream = { text: msgStreamed };

  const ms = anthropic.messages.stream(message);
  let msText = '';
  ms.on('text', (t) => (msText += t));
  const finalMessage = await ms.finalMessage();
  out.messagesHelper = {
    text: finalMessage.content[0].text,
    streamedText: msText,
    finalText: await ms.finalText(),
    outputTokens: finalMessage.usage.output_tokens,
  };
  return out;
}

// retry: the key's request quota holds one request; the second call of each SDK is
// refused once and retried after retry-after-ms.
async function retry() {
  const { openai, anthropic } = clients(2);
  const out = {};
  await openai.chat.completions.create({ ...chat, max_tokens: 10 });
  for (const [name, call] of [
    ['openai', () => openai.chat.completions.create({ ...chat, max_tokens: 10 })],
    ['anthropic', () => anthropic.messages.create({ ...message, max_tokens: 10 })],
  ]) {
    const before = attempts[name];
    const start = performance.now();
    await call();
    out[name] = { attempts: attempts[name] - before, ms: Math.round(performance.now() - start) };
  }
  return out;
}

// too-large: a request larger than the key's whole budget fails at once, retries on.
async function tooLarge() {
  const { openai, anthropic } = clients(2);
  const maxTokens = Number(process.env.MAX_TOKENS);
  const out = {};
  for (const [name, call] of [
    ['openai', () => openai.chat.completions.create({ ...chat, max_tokens: maxTokens })],
    ['anthropic', () => anthropic.messages.create({ ...message, max_tokens: maxTokens })],
  ]) {
    const start = performance.now();
    try {
      await call();
      out[name] = { error: null };
    } catch (err) {
      out[name] = {
        error: err.constructor.name,
        status: err.status,
        message: err.message,
        shouldRetry: err.headers?.get?.('x-should-retry') ?? null,
        retryAfter: err.headers?.get?.('retry-after') ?? null,
      };
    }
    out[name].attempts = attempts[name];
    out[name].ms = Math.round(performance.now() - start);
  }
  return out;
}

function pick(headers, ...names) {
  return Object.fromEntries(names.map((n) => [n, headers.get(n)]));
}

const scenarios = { calls, retry, 'too-large': tooLarge };
const scenario = scenarios[process.argv[2]];
if (!scenario) {
  console.error(`usage: node sdks.mjs ${Object.keys(scenarios).join('|')}`);
  process.exit(2);
}
try {
  console.log(JSON.stringify(await scenario()));
} catch (err) {
  console.error(err?.stack ?? err);
  process.exit(1);
}
