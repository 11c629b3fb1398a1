// A small markdown → DOM renderer for agent text, safe by construction.
//
// Agent output is untrusted. This never produces HTML source: it builds elements and text
// nodes, so `<script>` or `<img onerror>` in the text stays text. What it renders:
// paragraphs, headings, fenced and indented code blocks, inline code, **strong** and
// *emphasis* (`_` only at word boundaries), bullet and numbered lists, block quotes and
// links whose scheme is http(s) or mailto. Images are never loaded: `![alt](url)` becomes
// an inert link-like text "image: alt" (with the URL as plain text in its title), so a
// picture cannot call home. Anything else is shown as the text it is.

const SAFE_SCHEMES = new Set(['http:', 'https:', 'mailto:'])

/** The URL if its scheme is safe to follow, else null (javascript:, data:, relative…). */
export function safeHref (raw) {
  try {
    const url = new URL(raw.trim())
    return SAFE_SCHEMES.has(url.protocol) ? url.href : null
  } catch {
    return null
  }
}

/** Render `text` into a new DocumentFragment. */
export function renderMarkdown (text) {
  const frag = document.createDocumentFragment()
  const lines = text.replace(/\r\n?/g, '\n').split('\n')
  let i = 0
  while (i < lines.length) {
    const line = lines[i]
    const fence = /^\s{0,3}(```+|~~~+)\s*([\w+-]*)/.exec(line)
    if (fence) {
      const body = []
      i++
      while (i < lines.length && !lines[i].trimStart().startsWith(fence[1])) body.push(lines[i++])
      i++ // the closing fence (or the end of an unfinished one, while streaming)
      frag.append(codeBlock(body.join('\n'), fence[2]))
      continue
    }
    if (/^\s*$/.test(line)) { i++; continue }
    const heading = /^(#{1,6})\s+(.*)$/.exec(line)
    if (heading) {
      const h = document.createElement(`h${Math.min(heading[1].length + 2, 6)}`)
      h.append(inline(heading[2]))
      frag.append(h)
      i++
      continue
    }
    if (/^ {4}|^\t/.test(line)) {
      const body = []
      while (i < lines.length && (/^ {4}|^\t/.test(lines[i]) || /^\s*$/.test(lines[i]))) {
        body.push(lines[i++].replace(/^ {4}|^\t/, ''))
      }
      frag.append(codeBlock(body.join('\n').replace(/\n+$/, ''), ''))
      continue
    }
    if (/^\s*>/.test(line)) {
      const body = []
      while (i < lines.length && /^\s*>/.test(lines[i])) body.push(lines[i++].replace(/^\s*> ?/, ''))
      const q = document.createElement('blockquote')
      q.append(renderMarkdown(body.join('\n')))
      frag.append(q)
      continue
    }
    const item = listItem(line)
    if (item) {
      const list = document.createElement(item.ordered ? 'ol' : 'ul')
      if (item.ordered && item.start !== 1) list.start = item.start
      while (i < lines.length) {
        const it = listItem(lines[i])
        if (!it || it.ordered !== item.ordered) break
        const parts = [it.text]
        i++
        // Continuation lines indented under the item belong to it.
        while (i < lines.length && /^\s{2,}\S/.test(lines[i]) && !listItem(lines[i])) parts.push(lines[i++].trim())
        const li = document.createElement('li')
        li.append(inline(parts.join(' ')))
        list.append(li)
      }
      frag.append(list)
      continue
    }
    const para = []
    while (i < lines.length && !/^\s*$/.test(lines[i]) && !listItem(lines[i]) &&
           !/^\s{0,3}(```|~~~)|^#{1,6}\s|^\s*>/.test(lines[i])) {
      para.push(lines[i++])
    }
    const p = document.createElement('p')
    para.forEach((l, n) => {
      if (n) p.append(document.createElement('br'))
      p.append(inline(l))
    })
    frag.append(p)
  }
  return frag
}

function listItem (line) {
  const b = /^\s{0,3}[-*+]\s+(.*)$/.exec(line)
  if (b) return { ordered: false, text: b[1] }
  const n = /^\s{0,3}(\d{1,9})[.)]\s+(.*)$/.exec(line)
  if (n) return { ordered: true, start: Number(n[1]), text: n[2] }
  return null
}

function codeBlock (text, lang) {
  const pre = document.createElement('pre')
  const code = document.createElement('code')
  if (lang) code.dataset.lang = lang
  code.textContent = text
  pre.append(code)
  return pre
}

// Inline spans, in order of precedence: code, images (inert), links, autolinks, strong, emphasis.
const INLINE = [
  ['code', /`([^`]+)`/],
  ['image', /!\[([^\]]*)\]\(([^)\s]*)(?:\s+"[^"]*")?\)/],
  ['link', /\[([^\]]+)\]\(([^)\s]*)(?:\s+"[^"]*")?\)/],
  ['auto', /<?\b(https?:\/\/[^\s<>()]+[^\s<>().,;:!?'"])>?/],
  ['strong', /\*\*(?=\S)([\s\S]*?\S)\*\*|(?<![\w])__(?=\S)([\s\S]*?\S)__(?![\w])/],
  ['em', /\*(?=[^\s*])([^*]*?[^\s*])\*|(?<![\w])_(?=[^\s_])([^_]*?[^\s_])_(?![\w])/]
]

/** Inline markdown of one line → a DocumentFragment of text and safe elements. */
export function inline (text) {
  const frag = document.createDocumentFragment()
  let rest = text
  while (rest) {
    let best = null
    for (const [kind, re] of INLINE) {
      const m = re.exec(rest)
      if (m && (best === null || m.index < best.m.index)) best = { kind, m }
    }
    if (!best) { frag.append(document.createTextNode(rest)); break }
    const { kind, m } = best
    if (m.index) frag.append(document.createTextNode(rest.slice(0, m.index)))
    frag.append(span(kind, m))
    rest = rest.slice(m.index + m[0].length)
  }
  return frag
}

function span (kind, m) {
  switch (kind) {
    case 'code': {
      const c = document.createElement('code')
      c.textContent = m[1]
      return c
    }
    case 'image': {
      // Never an <img>: the picture is not fetched; its URL is shown, not followed.
      const s = document.createElement('span')
      s.className = 'md-image'
      s.textContent = `image: ${m[1] || 'untitled'}`
      s.title = m[2]
      return s
    }
    case 'link':
    case 'auto': {
      const label = kind === 'link' ? m[1] : m[1]
      const href = safeHref(kind === 'link' ? m[2] : m[1])
      if (!href) return document.createTextNode(kind === 'link' ? `${label} (${m[2]})` : m[0])
      const a = document.createElement('a')
      a.href = href
      a.rel = 'noopener noreferrer nofollow'
      a.target = '_blank'
      a.append(kind === 'link' ? inline(label) : document.createTextNode(label))
      return a
    }
    case 'strong':
    case 'em': {
      const e = document.createElement(kind)
      e.append(inline(m[1] ?? m[2]))
      return e
    }
  }
}
