// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package estimate

import "bytes"

// Media: a base64 payload a model receives as an image, audio or a document is not
// text, so its bytes are not counted as text. It costs MediaTokens plus a share of its
// decoded size that depends on its class (mediaBytesPerToken). Only real media blocks
// are priced this way; every other string, base64-looking or not, is text:
//   - a data URL with ";base64," under a key that carries media (url, image_url,
//     file_data): OpenAI image_url parts, Responses input_image and input_file;
//   - a bare base64 string under data or file_data in an object that says it holds
//     media: a media_type or mime_type that is not text/*, "type": "base64"
//     (Anthropic's image and document sources) or a format (OpenAI's input_audio).
//     The sibling may come before or after the payload: the object is priced when it
//     closes.
// A data URL or payload whose media type is text/* is text.

// mediaClass is what a payload holds.
type mediaClass uint8

const (
	mediaNone mediaClass = iota // not media: counted as text
	mediaImage
	mediaAudio
	mediaDocument // PDFs and every other or unknown media type
)

// mediaBytesPerToken is how many decoded bytes of each class cost one token beyond
// MediaTokens. Providers bound an image's tokens by its pixels, not its bytes;
// audio costs by its length; a document may carry pages of compressed text.
var mediaBytesPerToken = [...]int64{mediaImage: 4096, mediaAudio: 1024, mediaDocument: 8}

// MediaCost is what one payload of n decoded bytes of a media type costs; the
// media type's class decides the share (image/*, audio/*, anything else).
func MediaCost(mediaType string, n int64) int64 {
	return mediaCost(classOf([]byte(mediaType)), n)
}

func mediaCost(c mediaClass, n int64) int64 {
	return MediaTokens + n/mediaBytesPerToken[c]
}

// keyKind is the media role of an object key.
type keyKind uint8

const (
	keyNone      keyKind = iota
	keyURL               // url, image_url: a data URL is media
	keyData              // data: bare base64 is media when its object says so
	keyFileData          // file_data: both
	keyMediaType         // media_type, mime_type, mimeType: the class of the object's payload
	keyFormat            // format: an audio payload's format
	keyType              // type: "base64" marks a media source
)

func classifyKey(raw []byte) keyKind {
	switch string(raw) {
	case "url", "image_url":
		return keyURL
	case "data":
		return keyData
	case "file_data":
		return keyFileData
	case "media_type", "mime_type", "mimeType":
		return keyMediaType
	case "format":
		return keyFormat
	case "type":
		return keyType
	}
	return keyNone
}

// pendingMedia is the base64 payloads of one object, priced when the object closes.
type pendingMedia struct {
	count int64 // payloads
	bytes int64 // their decoded bytes
	text  int64 // what they cost as text
	// The hints, each from the last occurrence of its key as the upstream reads it.
	typeBase64, format, mediaType bool
	mtClass                       mediaClass
}

// forget drops what an earlier occurrence of a key said: the last one counts.
func (p *pendingMedia) forget(k keyKind) {
	switch k {
	case keyMediaType:
		p.mediaType = false
	case keyFormat:
		p.format = false
	case keyType:
		p.typeBase64 = false
	}
}

// class is the class of the object's payloads.
func (p *pendingMedia) class() mediaClass {
	c := mediaDocument
	switch {
	case p.mediaType:
		c = p.mtClass
	case p.format:
		c = mediaAudio
	case !p.typeBase64:
		c = mediaNone
	}
	return c
}

// isMedia reports whether the object's payloads are priced as media, not text.
func (p *pendingMedia) isMedia() bool { return p.count > 0 && p.class() != mediaNone }

// price is what the object's payloads cost.
func (p *pendingMedia) price() int64 {
	if p.count == 0 {
		return 0
	}
	c := p.class()
	if c == mediaNone {
		return p.text
	}
	return satAdd(satMul(MediaTokens, p.count), p.bytes/mediaBytesPerToken[c])
}

// stringTokens is what a string value costs: text, or media (media is then true)
// when it is a real media payload. A bare base64 payload is recorded on its object
// (parent) and costs nothing until the object closes.
// text is textRaw(raw), already counted.
func stringTokens(raw []byte, text int64, k keyKind, parent *frame) (tokens int64, media bool) {
	switch k {
	case keyURL, keyFileData:
		if c, n, ok := dataURL(raw); ok {
			if c == mediaNone {
				return text, false
			}
			return mediaCost(c, n), true
		}
	}
	if parent == nil {
		return text, false
	}
	m := &parent.media
	switch k {
	case keyData, keyFileData:
		if n, ok := base64Len(raw); ok {
			m.count++
			m.bytes += n
			m.text += text
			return 0, false
		}
	case keyMediaType:
		m.mediaType, m.mtClass = true, classOf(raw)
	case keyFormat:
		m.format = true
	case keyType:
		m.typeBase64 = string(raw) == "base64"
	}
	return text, false
}

// classOf is the class of a media type; text/* is not media.
func classOf(mt []byte) mediaClass {
	mt = bytes.ToLower(bytes.TrimSpace(mt))
	switch {
	case bytes.HasPrefix(mt, []byte("text/")):
		return mediaNone
	case bytes.HasPrefix(mt, []byte("image/")):
		return mediaImage
	case bytes.HasPrefix(mt, []byte("audio/")):
		return mediaAudio
	}
	return mediaDocument
}

// dataURL reads data:[TYPE][;PARAM...];base64,PAYLOAD and returns the class of TYPE and
// the payload's decoded size. ok is false for anything else, a data URL without
// base64 included.
func dataURL(raw []byte) (mediaClass, int64, bool) {
	if len(raw) < 5 || !bytes.EqualFold(raw[:5], []byte("data:")) {
		return 0, 0, false
	}
	comma := bytes.IndexByte(raw, ',')
	if comma < 0 {
		return 0, 0, false
	}
	header := raw[5:comma]
	if len(header) < 7 || !bytes.EqualFold(header[len(header)-7:], []byte(";base64")) {
		return 0, 0, false
	}
	n, ok := base64Len(raw[comma+1:])
	if !ok {
		return 0, 0, false
	}
	mt := header[:len(header)-7]
	if i := bytes.IndexByte(mt, ';'); i >= 0 {
		mt = mt[:i]
	}
	if len(mt) == 0 {
		return mediaDocument, n, true
	}
	return classOf(mt), n, true
}

// base64Len reports whether a raw JSON string is base64 (standard or URL alphabet,
// padding, and the escaped slash "\/" some encoders write) and its decoded size.
func base64Len(raw []byte) (int64, bool) {
	if len(raw) == 0 {
		return 0, false
	}
	var chars int64
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '+', c == '/', c == '-', c == '_':
			chars++
		case c == '=':
		case c == '\\' && i+1 < len(raw) && raw[i+1] == '/':
			chars++
			i++
		default:
			return 0, false
		}
	}
	return chars * 3 / 4, true
}
