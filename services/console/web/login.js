// The login page: shows why the last attempt failed.
const messages = {
  token: 'No service knows this token. Check it against the auth policy.',
  empty: 'Enter a token.',
  unavailable: 'The services cannot be reached right now; try again.',
  form: 'The form could not be read; try again.',
};
const code = new URLSearchParams(location.search).get('error');
if (code) {
  const p = document.getElementById('error');
  p.textContent = messages[code] || 'Login failed.';
  p.hidden = false;
}
document.getElementById('token').focus();
