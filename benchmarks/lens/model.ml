(* A nested record model (company / divisions / teams / employees) with lenses for
   every field. *)

type address = { street : int; zip : int }
type employee = { id : int; salary : int; rating : float; home : address }
type team = { lead : employee; members : employee array; budget : int }
type division = { code : int; alpha : team; beta : team }
type company = { hq : address; north : division; south : division; revenue : int }

let street = Lens.make (fun a -> a.street) (fun street a -> { a with street })
let zip = Lens.make (fun a -> a.zip) (fun zip a -> { a with zip })
let salary = Lens.make (fun e -> e.salary) (fun salary e -> { e with salary })
let rating = Lens.make (fun e -> e.rating) (fun rating e -> { e with rating })
let home = Lens.make (fun e -> e.home) (fun home e -> { e with home })
let lead = Lens.make (fun t -> t.lead) (fun lead t -> { t with lead })
let members = Lens.make (fun t -> t.members) (fun members t -> { t with members })
let budget = Lens.make (fun t -> t.budget) (fun budget t -> { t with budget })
let alpha = Lens.make (fun d -> d.alpha) (fun alpha d -> { d with alpha })
let beta = Lens.make (fun d -> d.beta) (fun beta d -> { d with beta })
let code = Lens.make (fun d -> d.code) (fun code d -> { d with code })
let hq = Lens.make (fun c -> c.hq) (fun hq c -> { c with hq })
let north = Lens.make (fun c -> c.north) (fun north c -> { c with north })
let south = Lens.make (fun c -> c.south) (fun south c -> { c with south })
let revenue = Lens.make (fun c -> c.revenue) (fun revenue c -> { c with revenue })

let employee seed = { id = seed; salary = 1000 + (seed * 37 mod 500); rating = float (seed mod 5); home = { street = seed; zip = 10000 + seed } }
let team seed = { lead = employee seed; members = Array.init 4 (fun i -> employee (seed + i + 1)); budget = seed * 100 }
let division seed = { code = seed; alpha = team (seed * 10); beta = team ((seed * 10) + 5) }
let initial = { hq = { street = 1; zip = 10001 }; north = division 1; south = division 2; revenue = 0 }
