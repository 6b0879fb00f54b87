(* A toroidal board of cells, one byte per cell (0 dead, 1 alive). *)

type t = { w : int; h : int; cells : Bytes.t }

let create w h = { w; h; cells = Bytes.make (w * h) '\000' }

let copy b = { b with cells = Bytes.copy b.cells }

let wrap i n = if i < 0 then i + n else if i >= n then i - n else i
let index b x y = (wrap y b.h * b.w) + wrap x b.w
let get b x y = Char.code (Bytes.unsafe_get b.cells (index b x y))
let set b x y v = Bytes.unsafe_set b.cells (index b x y) (Char.unsafe_chr v)

let offsets = [| (-1, -1); (0, -1); (1, -1); (-1, 0); (1, 0); (-1, 1); (0, 1); (1, 1) |]

let neighbours b x y =
  Array.fold_left (fun n (dx, dy) -> n + get b (x + dx) (y + dy)) 0 offsets

(* fills [dst] from [src] by a per-cell rule: alive now, live neighbours -> alive next *)
let step rule src dst =
  for y = 0 to src.h - 1 do
    for x = 0 to src.w - 1 do
      set dst x y (if rule (get src x y = 1) (neighbours src x y) then 1 else 0)
    done
  done

let population b =
  let n = ref 0 in
  Bytes.iter (fun c -> if c <> '\000' then incr n) b.cells;
  !n

let hash b =
  let h = ref 17 in
  Bytes.iteri (fun i c -> if c <> '\000' then h := ((!h * 31) + i) land 0x3fffffff) b.cells;
  !h
