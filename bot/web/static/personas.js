// The persona picker: which system-prompt preset a *new* conversation starts with.
// A persona cannot change in the middle of a conversation (its instructions open the
// token-exact history every later prompt and the prefix cache build on), so the picker
// is only open while the conversation has no message yet.

const $ = (id) => document.getElementById(id);

export async function loadPersonas(api) {
  const select = $("persona");
  let listed = [];
  try {
    listed = (await api.personas()).personas;
  } catch {
    listed = []; // an older server, or a refusal: the default is all there is
  }
  select.replaceChildren(new Option("Default", ""));
  for (const persona of listed) {
    const option = new Option(persona.name, persona.name);
    if (persona.description) option.title = persona.description;
    select.append(option);
  }
  $("persona-picker").hidden = listed.length === 0;
}

// Open for a conversation without messages; shows (and keeps) a started one's persona.
export function showPersona(started, persona) {
  const select = $("persona");
  if (started) {
    if (persona && ![...select.options].some((option) => option.value === persona)) {
      select.append(new Option(persona, persona)); // since removed from the config
    }
    select.value = persona || "";
  }
  select.disabled = started;
}

export function personaOpen() {
  return !$("persona").disabled;
}

// The persona the next message starts its conversation with, if it starts one.
export function chosenPersona() {
  const select = $("persona");
  return select.disabled ? null : select.value || null;
}
