// The console's only script: the WebAuthn calls a server cannot make
// (navigator.credentials.create and .get), copy buttons, and keeping a
// page that shows a secret once from being posted again on reload. Every
// page works with the keyboard; the forms work without this file except the
// passkey steps, which need the browser.
(function () {
  'use strict';

  function csrfToken() {
    var m = document.querySelector('meta[name="csrf-token"]');
    return m ? m.content : '';
  }

  function fromB64url(s) {
    s = s.replace(/-/g, '+').replace(/_/g, '/');
    while (s.length % 4) s += '=';
    var bin = atob(s);
    var out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out.buffer;
  }

  function toB64url(buf) {
    var bytes = new Uint8Array(buf);
    var bin = '';
    for (var i = 0; i < bytes.length; i++) bin += String.fromCharCode(bytes[i]);
    return btoa(bin).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
  }

  // post sends JSON to one of the console's passkey calls and returns the
  // answer, or throws an Error carrying the server's own sentence.
  async function post(path, body) {
    var res = await fetch(path, {
      method: 'POST',
      credentials: 'same-origin',
      headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': csrfToken() },
      body: JSON.stringify(body || {})
    });
    var data = {};
    try { data = await res.json(); } catch (e) { /* not JSON */ }
    if (!res.ok || data.ok === false) {
      var err = new Error(data.error || ('The server answered ' + res.status + '.'));
      err.details = data.details || {};
      throw err;
    }
    return data;
  }

  function creationOptions(options) {
    var pk = options.publicKey;
    pk.challenge = fromB64url(pk.challenge);
    pk.user.id = fromB64url(pk.user.id);
    (pk.excludeCredentials || []).forEach(function (c) { c.id = fromB64url(c.id); });
    return pk;
  }

  function requestOptions(options) {
    var pk = options.publicKey;
    pk.challenge = fromB64url(pk.challenge);
    (pk.allowCredentials || []).forEach(function (c) { c.id = fromB64url(c.id); });
    return pk;
  }

  // credentialJSON is the PublicKeyCredential in the JSON form the server
  // parses (the shape of PublicKeyCredential.toJSON()).
  function credentialJSON(cred) {
    var r = cred.response;
    var out = {
      id: cred.id,
      rawId: toB64url(cred.rawId),
      type: cred.type,
      clientExtensionResults: cred.getClientExtensionResults ? cred.getClientExtensionResults() : {},
      response: { clientDataJSON: toB64url(r.clientDataJSON) }
    };
    if (cred.authenticatorAttachment) out.authenticatorAttachment = cred.authenticatorAttachment;
    if (r.attestationObject) {
      out.response.attestationObject = toB64url(r.attestationObject);
      if (r.getTransports) out.response.transports = r.getTransports();
    } else {
      out.response.authenticatorData = toB64url(r.authenticatorData);
      out.response.signature = toB64url(r.signature);
      if (r.userHandle) out.response.userHandle = toB64url(r.userHandle);
    }
    return out;
  }

  // ceremony runs one passkey ceremony: "register" adds a passkey,
  // "assert" checks one. Only an assertion makes the session's passkey
  // check fresh (for minting, and for adding a second passkey).
  async function ceremony(kind) {
    if (!window.PublicKeyCredential || !navigator.credentials) {
      throw new Error('This browser cannot use passkeys.');
    }
    var begin = await post('/console/passkeys/' + kind + '/begin');
    var cred = kind === 'register'
      ? await navigator.credentials.create({ publicKey: creationOptions(begin.options) })
      : await navigator.credentials.get({ publicKey: requestOptions(begin.options) });
    if (!cred) throw new Error('The browser returned no passkey.');
    await post('/console/passkeys/' + kind + '/finish', { ceremony: begin.ceremony, response: credentialJSON(cred) });
  }

  // register adds a passkey. On an account that already has one, the
  // server accepts a registration only after a fresh assertion with an
  // existing passkey: the page says so (data-passkey-register="assert-first")
  // and the assertion runs first; should the server still ask for one (the
  // page was stale), it runs and the registration is tried once more.
  async function register(assertFirst, status) {
    if (assertFirst) {
      status('Confirm with a passkey you already have…');
      await ceremony('assert');
      status('Now create the new passkey…');
    }
    try {
      await ceremony('register');
    } catch (err) {
      if (assertFirst || !err.details || !err.details.passkey_required) throw err;
      await register(true, status);
    }
  }

  function explain(err) {
    if (err && err.name === 'NotAllowedError') return 'The passkey request was cancelled or timed out. Try again.';
    if (err && err.name === 'InvalidStateError') return 'This device already holds a passkey for your account.';
    if (err && err.name === 'SecurityError') return 'The browser refused the passkey for this address. Open the console at the address meshd printed.';
    return sentence((err && err.message) || String(err));
  }

  // sentence starts a message with a capital and ends it with a full stop,
  // as the pages show the server's messages.
  function sentence(msg) {
    msg = String(msg).trim();
    if (!msg) return msg;
    msg = msg.charAt(0).toUpperCase() + msg.slice(1);
    return /[.!?]$/.test(msg) ? msg : msg + '.';
  }

  function say(id, text) {
    var el = document.getElementById(id);
    if (el) el.textContent = text;
  }

  document.addEventListener('DOMContentLoaded', function () {
    // Register a passkey.
    var reg = document.querySelector('[data-passkey-register]');
    if (reg) {
      reg.addEventListener('click', async function () {
        reg.disabled = true;
        say('register-error', '');
        say('register-status', 'Waiting for your passkey…');
        try {
          await register(reg.getAttribute('data-passkey-register') === 'assert-first',
            function (text) { say('register-status', text); });
          say('register-status', 'Passkey registered.');
          window.location.assign('/console/passkeys?registered=1');
        } catch (err) {
          say('register-status', '');
          say('register-error', explain(err));
          reg.disabled = false;
          reg.focus();
        }
      });
    }

    // A form that needs a fresh passkey check: assert first, then send it.
    document.querySelectorAll('form[data-passkey-assert]').forEach(function (form) {
      var name = form.getAttribute('data-passkey-assert');
      form.addEventListener('submit', async function (ev) {
        ev.preventDefault();
        var button = form.querySelector('button[type="submit"]');
        if (button) button.disabled = true;
        say(name + '-error', '');
        say(name + '-status', 'Confirm with your passkey…');
        try {
          await ceremony('assert');
          say(name + '-status', form.getAttribute('data-passkey-done') || 'Passkey confirmed. Minting the key…');
          form.submit();
        } catch (err) {
          say(name + '-status', '');
          say(name + '-error', explain(err));
          if (button) { button.disabled = false; button.focus(); }
        }
      });
    });

    // Copy buttons (shown only where the clipboard can be written).
    if (navigator.clipboard && window.isSecureContext) {
      document.querySelectorAll('button[data-copy]').forEach(function (b) {
        b.hidden = false;
        var label = b.textContent;
        b.addEventListener('click', async function () {
          var src = document.getElementById(b.getAttribute('data-copy'));
          try {
            await navigator.clipboard.writeText(src.textContent.trim());
            b.textContent = 'Copied';
          } catch (e) {
            b.textContent = 'Copy failed: select the text instead';
          }
          setTimeout(function () { b.textContent = label; }, 2500);
        });
      });
    }

    // A page that shows a secret answers a form post: move the focus to it,
    // and since reloading must not post again (and mint a second key),
    // turn the history entry into a plain GET of the page.
    var secret = document.querySelector('.secret h2');
    if (secret) {
      secret.focus();
      if (window.history.replaceState) window.history.replaceState(null, '', window.location.pathname);
    }
  });
})();
